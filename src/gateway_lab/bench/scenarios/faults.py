"""Fault benchmark: what clients see when one worker of four is sick.

Scenarios, each on a fresh fleet of simulated workers (one process each,
so a SIGKILL is real) behind a gateway process, with closed-loop clients (half of
them streaming) for a bounded time and a per-request deadline:

* ``kill``  - worker 0 is SIGKILLed a third of the way in;
* ``stall`` - worker 0 holds every request 30 s before its first token;
* ``flaky`` - worker 0 fails half its requests after 4 tokens.

Each request ends ``ok`` (a whole answer / a stream with every event and ``[DONE]``),
``failed`` (an error status, an error event, a broken connection) or ``hung`` (no
answer within the deadline). For token-gateway the run also reads ``/metrics``:
streams resumed, retries, and the in-flight gauges at the end (must be 0).

``--soak-seconds N`` instead runs one long load where the sick roles rotate every
``--rotate-s``: one worker is killed (abruptly stopped) and restarted on its port
half a period later, one stalls, one is flaky, one is healthy. These workers run in
the driver's process so their faults flip live (the three scenarios use one process
per worker and a real SIGKILL).

    token-gateway bench faults --seconds 40
    token-gateway bench faults --gateways ours smg
    token-gateway bench faults --soak-seconds 180
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import re
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import orjson

from gateway_lab.bench import launch, results
from gateway_lab.sim.config import SimConfig
from gateway_lab.sim.fleet import SimFleet
from gateway_lab.sim.worker import SimWorker

SCENARIOS = ("kill", "stall", "flaky")
SIM = SimConfig(step_base_s=0.002, prefill_token_s=20e-6, decode_seq_s=0.0002)
SYSTEMS = [f"You are helper {i}. " + "Keep every answer short and exact. " * (8 + 4 * i) for i in range(4)]
FAULT_FLAGS = {
    "stall": {"fault_stall_s": 30.0, "fault_stall_after_tokens": 0},
    "flaky": {"fault_fail_after_tokens": 4, "fault_fail_share": 0.5},
}


@dataclass
class Result:
    gateway: str
    scenario: str
    seconds: float
    outcomes: Counter[str] = field(default_factory=Counter)
    examples: list[str] = field(default_factory=list)
    counters: dict[str, float] = field(default_factory=dict)

    def row(self) -> list[str]:
        o, c = self.outcomes, self.counters
        counted = [f"{c.get(k, 0):g}" if c else "n/a" for k in COUNTERS]
        return [self.gateway, self.scenario, f"{self.seconds:.0f}", str(o["ok"]), str(o["failed"]), str(o["hung"]), *counted]


COUNTERS = ("resumed", "retries", "watchdog_stalls", "breaker_opens", "in_flight_end")
HEADER = ("gateway", "fault", "s", "ok", "failed", "hung", "resumed", "retries", "watchdog stalls", "breaker opens",
          "in flight at end")  # fmt: skip


# ---------------------------------------------------------------- gateways
OURS_FLAGS = ["--log-level", "warning", "--no-access-log", "--health-check-interval-s", "2"]


def start_gateway(kind: str, urls: list[str], policy: str) -> contextlib.AbstractAsyncContextManager[launch.Gateway]:
    return launch.gateway(kind, urls, policy, extra_args=OURS_FLAGS if kind == "ours" else ())


async def scrape(http: httpx.AsyncClient) -> dict[str, float]:
    text = (await http.get("/metrics")).text
    out: dict[str, float] = defaultdict(float)
    wanted = {
        "token_gateway_resumes_total": "resumed",
        "token_gateway_retries_total": "retries",
        "token_gateway_worker_watchdog_stalls_total": "watchdog_stalls",
        "token_gateway_worker_breaker_opens_total": "breaker_opens",
        "token_gateway_worker_in_flight": "in_flight_end",
        "token_gateway_worker_queued_prefill_tokens": "queued_prefill_end",
        "token_gateway_worker_running_decode_tokens": "running_decode_end",
        "token_gateway_http_requests_in_flight": "http_in_flight_end",
    }
    for line in text.splitlines():
        m = re.match(r"^([a-z_]+)(\{[^}]*\})? ([0-9.e+-]+)$", line)
        if m and m.group(1) in wanted:
            labels = m.group(2) or ""
            if m.group(1) == "token_gateway_resumes_total" and 'outcome="ok"' not in labels:
                continue
            out[wanted[m.group(1)]] += float(m.group(3))
    out["http_in_flight_end"] = max(0.0, out["http_in_flight_end"] - 1)  # minus this scrape itself
    return dict(out)


# ---------------------------------------------------------------- clients
async def one_request(http: httpx.AsyncClient, model: str, rng: random.Random, stream: bool) -> tuple[str, str]:
    body = {
        "model": model, "prompt": rng.choice(SYSTEMS) + f"Question {rng.randrange(10_000)}?",
        "max_tokens": rng.randint(16, 64), "stream": stream, "temperature": 0.8,
    }
    if not stream:
        r = await http.post("/v1/completions", json=body)
        if r.status_code != 200:
            return "failed", f"HTTP {r.status_code}: {r.text[:160]}"
        data = r.json()
        return ("ok", "") if data.get("choices") else ("failed", "no choices")
    async with http.stream("POST", "/v1/completions", json=body) as r:
        if r.status_code != 200:
            return "failed", f"HTTP {r.status_code}: {(await r.aread())[:160]!r}"
        done = False
        async for line in r.aiter_lines():
            if not line.startswith("data: "):
                continue
            if line == "data: [DONE]":
                done = True
                break
            event = orjson.loads(line[6:])
            if isinstance(event, dict) and "error" in event:
                return "failed", f"error event: {str(event['error'])[:160]}"
        return ("ok", "") if done else ("failed", "stream ended without [DONE]")


async def drive(
    url: str, seconds: float, clients: int, deadline_s: float, result: Result, on_tick: Callable[[float], None] | None = None,
) -> None:
    async with httpx.AsyncClient(base_url=url, timeout=deadline_s + 10, trust_env=False,
                                 limits=httpx.Limits(max_connections=clients * 2)) as http:
        model = (await http.get("/v1/models")).json()["data"][0]["id"]
        started = time.monotonic()

        async def client(k: int) -> None:
            rng = random.Random(k)
            while time.monotonic() - started < seconds:
                try:
                    async with asyncio.timeout(deadline_s):
                        outcome, detail = await one_request(http, model, rng, stream=k % 2 == 0)
                except TimeoutError:
                    outcome, detail = "hung", f"no answer in {deadline_s:g} s"
                except httpx.HTTPError as exc:
                    outcome, detail = "failed", f"{type(exc).__name__}: {exc}"
                result.outcomes[outcome] += 1
                if outcome != "ok" and len(result.examples) < 8:
                    result.examples.append(detail)

        async def ticker() -> None:
            while time.monotonic() - started < seconds:
                await asyncio.sleep(0.5)
                if on_tick is not None:
                    on_tick(time.monotonic() - started)

        await asyncio.gather(ticker(), *(client(k) for k in range(clients)))
        result.seconds = time.monotonic() - started


async def settle(url: str, kind: str, timeout_s: float = 10.0) -> dict[str, float]:
    if kind != "ours":
        return {}
    async with httpx.AsyncClient(base_url=url, timeout=5, trust_env=False) as http:
        deadline = time.monotonic() + timeout_s
        while True:
            counters = await scrape(http)
            busy = counters.get("in_flight_end", 0) + counters.get("queued_prefill_end", 0) + counters.get("running_decode_end", 0)
            if not busy or time.monotonic() > deadline:
                return counters
            await asyncio.sleep(0.2)


# ---------------------------------------------------------------- runs
async def scenario(kind: str, name: str, args: argparse.Namespace) -> Result:
    result = Result(kind, name, 0.0)
    faults = {0: FAULT_FLAGS[name]} if name in FAULT_FLAGS else {}
    async with launch.fleet("processes", args.workers, SIM, faults=faults, extra_args=["--engine", args.engine]) as fleet:
        policy = "round_robin" if name == "stall" else args.policy
        async with start_gateway(kind, fleet.urls, policy) as gw:
            killed = False

            def tick(elapsed: float) -> None:
                nonlocal killed
                if name == "kill" and not killed and elapsed >= args.seconds / 3:
                    killed = True
                    fleet.kill(0)

            await drive(gw.url, args.seconds, args.clients, args.deadline_s, result, tick)
            result.counters = await settle(gw.url, kind)
    return result


def set_faults(worker: SimWorker, kind: str | None) -> None:
    """Make a live worker stall, fail half its requests, or behave (``None``)."""
    f = worker.faults
    f.stall_s, f.stall_after_tokens, f.fail_after_tokens, f.fail_share = 0.0, 0, -1, 1.0
    if kind == "stall":
        f.stall_s = 30.0
    elif kind == "flaky":
        f.fail_after_tokens, f.fail_share = 4, 0.5


async def soak(args: argparse.Namespace) -> Result:
    """One worker killed and restarted, one stalling, one flaky, one healthy; the roles
    move one worker along every ``--rotate-s``. The workers run in this process, so their
    faults flip live."""
    result = Result("ours", f"soak (roles rotate every {args.rotate_s:g} s)", 0.0)
    async with launch.fleet("sim", args.workers, SIM) as fleet, start_gateway("ours", fleet.urls, args.policy) as gw:
        await _rotating(gw.url, fleet, args, result)
    return result


async def _rotating(url: str, fleet: SimFleet, args: argparse.Namespace, result: Result) -> None:
    """The soak's load while the roles rotate; the counters once it has settled."""
    n = args.workers
    pending: set[asyncio.Task[None]] = set()
    state = {"round": -1, "dead": -1, "killed_at": 0.0, "rotations": 0}

    async def rotate(rnd: int, elapsed: float) -> None:
        killed, stalling, flaky = rnd % n, (rnd + 1) % n, (rnd + 2) % n
        if state["dead"] >= 0:
            await fleet.restart(int(state["dead"]))
            state["dead"] = -1
        for i, worker in enumerate(fleet.workers):
            set_faults(worker, "stall" if i == stalling else "flaky" if i == flaky else None)
        await fleet.kill(killed)
        state["dead"], state["killed_at"] = killed, elapsed
        state["rotations"] += 1

    async def revive() -> None:
        if state["dead"] >= 0:
            i = int(state["dead"])
            state["dead"] = -1
            await fleet.restart(i)

    def tick(elapsed: float) -> None:
        rnd = int(elapsed // args.rotate_s)
        job = None
        if rnd != state["round"]:
            state["round"] = rnd
            job = rotate(rnd, elapsed)
        elif state["dead"] >= 0 and elapsed - state["killed_at"] >= args.rotate_s / 2:
            job = revive()
        if job is not None:
            task = asyncio.ensure_future(job)
            pending.add(task)
            task.add_done_callback(pending.discard)

    await drive(url, args.soak_seconds, args.clients, args.deadline_s, result, tick)
    if pending:
        await asyncio.gather(*pending)
    for worker in fleet.workers:
        set_faults(worker, None)
    result.counters = await settle(url, "ours")
    result.counters["rotations"] = state["rotations"]


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The scenario's flags (``token-gateway bench NAME --help``)."""
    p.add_argument("--seconds", type=float, default=40.0, help="length of each scenario")
    p.add_argument("--clients", type=int, default=16, help="closed-loop clients (even ones stream)")
    p.add_argument("--workers", type=int, default=4)
    p.add_argument(
        "--engine", default="sglang", choices=["sglang", "vllm", "trtllm"],
        help="the gRPC service the simulated workers serve (the three scenarios; the soak runs SGLang's)",
    )
    p.add_argument("--deadline-s", type=float, default=20.0, help="per-request deadline; past it a request counts as hung")
    p.add_argument("--policy", default="cache_aware")
    p.add_argument("--gateways", nargs="+", default=["ours"], choices=["ours", "smg"])
    p.add_argument("--scenarios", nargs="+", default=list(SCENARIOS), choices=SCENARIOS)
    p.add_argument("--soak-seconds", type=float, default=0.0, help="run the rotating fault soak this long instead")
    p.add_argument("--rotate-s", type=float, default=20.0, help="soak: seconds between role rotations")
    p.add_argument("--json", type=Path, default=None, help="also write the results here")


def main(args: argparse.Namespace) -> int:
    """Run the scenario with parsed flags; the exit status."""
    return asyncio.run(measure(args))


async def measure(args: argparse.Namespace) -> int:
    outcome = results.Result()
    runs: list[Result] = []
    if args.soak_seconds > 0:
        runs.append(await soak(args))
    else:
        for kind in args.gateways:
            for name in args.scenarios:
                r = await scenario(kind, name, args)
                runs.append(r)
                print(" | ".join(r.row()), flush=True)
    outcome.tables.append(results.Table.of("what clients see with one sick worker", HEADER, [r.row() for r in runs]))
    for r in runs:
        outcome.notes += [f"{r.gateway} {r.scenario}: e.g. {ex}" for ex in r.examples[:3]]
        if r.counters:
            outcome.notes.append(f"{r.gateway} {r.scenario}: counters at the end: {json.dumps(r.counters, sort_keys=True)}")
    outcome.data = {"runs": [{**r.__dict__, "outcomes": dict(r.outcomes)} for r in runs]}
    return results.write(outcome, json_path=args.json or "")
