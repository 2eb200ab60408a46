"""Control-plane figures: failover when a worker dies under load, and admission overhead.

* ``failover``: N simulated workers (in this process) behind a ``token-gateway serve``
  child; C closed-loop clients stream short completions for ``--duration`` seconds;
  one worker is killed at ``--kill-at``. Reports client-visible errors before and
  after the kill (only streams that already had output on the dead worker may fail),
  requests that still reached the dead worker afterwards, and when the gateway took
  it out of rotation (breaker open / health probes failed), as seen on ``GET /workers``.
* ``admission``: microseconds per admitted request through ``Admission`` without
  contention and with a FIFO queue in front of a concurrency cap.

Every phase is bounded in time. Run:

    token-gateway bench control failover
    token-gateway bench control admission
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from collections import Counter
from typing import Any

import httpx

from gateway.server.admission import Admission, AdmissionConfig
from gateway_lab.bench import launch, results
from gateway_lab.sim.config import SimConfig
from gateway_lab.sim.fleet import SimFleet


async def failover(args: argparse.Namespace) -> dict[str, Any]:
    sim = SimConfig(step_base_s=0.004, prefill_token_s=0.0, decode_seq_s=0.0001, time_scale=1.0)
    with tempfile.TemporaryDirectory() as tmp:
        flags = [
            "--tokenizer-cache-dir", f"{tmp}/tok",
            "--health-check-interval-s", str(args.health_interval),
            "--health-unhealthy-interval-s", str(args.health_interval / 2),
            "--health-failure-threshold", "2",
        ]  # fmt: skip
        async with (
            launch.fleet("sim", args.workers, sim) as fleet,
            launch.gateway(
                "ours", fleet.urls, args.policy, extra_args=flags, log_dir=args.log_dir or tmp, keep_log=bool(args.log_dir)
            ) as gw,
        ):
            return await _drive(args, fleet, gw)


async def _drive(args: argparse.Namespace, fleet: SimFleet, gw: launch.Gateway) -> dict[str, Any]:
    victim = fleet.workers[0]
    victim_id = f"{victim.host}:{victim.port}"
    limits = httpx.Limits(max_connections=args.clients + 4)
    async with httpx.AsyncClient(base_url=gw.url, timeout=30, limits=limits, trust_env=False) as http:
        model = (await http.get("/v1/models")).json()["data"][0]["id"]
        start = time.monotonic()
        stop_at = start + args.duration
        killed_at: list[float] = []
        outcomes: list[tuple[float, str, str]] = []  # (time since start, outcome, worker)
        marks: dict[str, float] = {}

        async def one() -> tuple[str, str]:
            body = {"model": model, "prompt": "hello there", "max_tokens": args.tokens, "stream": True, "ignore_eos": True}
            try:
                async with http.stream("POST", "/v1/completions", json=body) as resp:
                    worker = resp.headers.get("x-worker-id", "")
                    if resp.status_code != 200:
                        await resp.aread()
                        return f"http_{resp.status_code}", worker
                    async for line in resp.aiter_lines():
                        if line.startswith("data: ") and '"error"' in line:
                            return "stream_error", worker
                    return "ok", worker
            except httpx.HTTPError as exc:
                return type(exc).__name__, ""

        async def client() -> None:
            while time.monotonic() < stop_at:
                outcome, worker = await one()
                outcomes.append((time.monotonic() - start, outcome, worker))

        async def killer() -> None:
            await asyncio.sleep(args.kill_at)
            killed_at.append(time.monotonic() - start)
            await victim.kill()

        async def watcher() -> None:
            while time.monotonic() < stop_at:
                rows = (await http.get("/workers")).json()["workers"]
                for row in rows:
                    if row["id"] != victim_id:
                        continue
                    t = time.monotonic() - start
                    if row["breaker"] != "closed":
                        marks.setdefault("breaker_open_s", t)
                    if not row["healthy"]:
                        marks.setdefault("unhealthy_s", t)
                await asyncio.sleep(0.05)

        await asyncio.gather(killer(), watcher(), *(client() for _ in range(args.clients)))
    kill_t = killed_at[0]
    before = [o for o in outcomes if o[0] < kill_t]
    after = [o for o in outcomes if o[0] >= kill_t]
    settle = max(marks.values(), default=kill_t)
    after_settled = [o for o in after if o[0] > settle]
    return {
        "workers": args.workers,
        "clients": args.clients,
        "requests": len(outcomes),
        "kill_at_s": round(kill_t, 3),
        "errors_before_kill": dict(Counter(o[1] for o in before if o[1] != "ok")),
        "errors_after_kill": dict(Counter(o[1] for o in after if o[1] != "ok")),
        "requests_after_kill": len(after),
        "breaker_open_after_s": round(marks["breaker_open_s"] - kill_t, 3) if "breaker_open_s" in marks else None,
        "unhealthy_after_s": round(marks["unhealthy_s"] - kill_t, 3) if "unhealthy_s" in marks else None,
        "errors_once_out_of_rotation": sum(1 for o in after_settled if o[1] != "ok"),
        "served_by_dead_worker_after_out_of_rotation": sum(1 for o in after_settled if o[2] == victim_id),
        "throughput_rps_before": round(len(before) / kill_t, 1),
        "throughput_rps_after": round(len(after) / max(1e-9, args.duration - kill_t), 1),
    }


async def admission(args: argparse.Namespace) -> dict[str, Any]:
    n = args.requests
    open_gate = Admission(AdmissionConfig())
    started = time.perf_counter()
    for _ in range(n):
        async with open_gate.admit("k"):
            pass
    uncontended = (time.perf_counter() - started) / n * 1e6

    capped = Admission(AdmissionConfig(max_concurrent_requests=8, max_queued_requests=n, queue_timeout_s=60))

    async def one() -> None:
        async with capped.admit("k"):
            await asyncio.sleep(0)

    started = time.perf_counter()
    for _ in range(n // 256):
        await asyncio.gather(*(one() for _ in range(256)))
    contended = (time.perf_counter() - started) / (n // 256 * 256) * 1e6

    limited = Admission(AdmissionConfig(rate_limit_per_s=1e9, rate_limit_burst=10**9))
    started = time.perf_counter()
    for i in range(n):
        async with limited.admit(f"key-{i % 100}"):
            pass
    rate = (time.perf_counter() - started) / n * 1e6
    return {
        "requests": n,
        "uncontended_us": round(uncontended, 2),
        "queued_cap8_256_waiting_us": round(contended, 2),
        "rate_limited_100_keys_us": round(rate, 2),
    }


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The scenario's flags (``token-gateway bench NAME --help``)."""
    sub = parser.add_subparsers(dest="what", required=True)
    f = sub.add_parser("failover")
    f.add_argument("--workers", type=int, default=4)
    f.add_argument("--clients", type=int, default=32)
    f.add_argument("--tokens", type=int, default=32)
    f.add_argument("--duration", type=float, default=12.0)
    f.add_argument("--kill-at", type=float, default=4.0)
    f.add_argument("--health-interval", type=float, default=1.0)
    f.add_argument("--policy", default="round_robin")
    f.add_argument("--log-dir", default=None, help="keep the gateway's log here")
    a = sub.add_parser("admission")
    a.add_argument("--requests", type=int, default=100_000)
    for phase in (f, a):
        phase.add_argument("--json", default="", help="also write the results here as JSON")


def main(args: argparse.Namespace) -> int | None:
    """Run the scenario with parsed flags; the exit status."""
    figures = asyncio.run(failover(args) if args.what == "failover" else admission(args))
    out = result(args.what, figures)
    # before the kill every worker is healthy: an error then is the run's, not the failover's
    out.require(not figures.get("errors_before_kill"), f"errors before the kill: {figures.get('errors_before_kill')}")
    return results.write(out, json_path=args.json)


def result(what: str, figures: dict[str, Any]) -> results.Result:
    """A phase's figures as a two-column table of the common result format (and at the JSON's top level)."""
    rows = [(name, json.dumps(value) if isinstance(value, dict) else value) for name, value in figures.items()]
    return results.Result(tables=[results.Table.of(what, ("figure", "value"), rows, labels=1)], data=figures)
