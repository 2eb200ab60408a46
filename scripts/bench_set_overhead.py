"""What a ``--processes`` set costs per request beyond two busy processes, on canned workers.

Why: the set's ratio to one process (``bench_scaleout.py --sections throughput``) mixes
two things, the set's own work (routing sync, every process's tree taking every
process's decisions, nats-server) and what any two busy processes cost each other on a
small host (shared caches, the kernel's loopback work charged to whoever is running).
This separates them, and compares two builds of the gateway in the same run, with the
figure that is robust on a shared host: CPU per request (the serving process tree, from
/proc), beside requests/s.

``pair``: alternating wrk rounds of one process (48 connections), ``--processes 2`` (48)
and two independent one-process gateways driven at once (24 each, no sync): the last is
what two processes cost without the set's work, so ``processes-2`` minus it is the
set's own overhead.

``ab``: two gateways, each with its own flags and (``--src-a/--src-b``) its own source
tree on ``PYTHONPATH`` (e.g. an exported copy of main's ``src``), in alternating rounds;
per round, how wrk's connections and the requests were split over the serving processes.

    .venv/bin/python scripts/bench_set_overhead.py pair
    .venv/bin/python scripts/bench_set_overhead.py ab --a "--processes 2" --b "--processes 2" --src-a BASE/src

Workers are ``gateway_lab.bench.canned_fleet`` (nginx, ~0.02 ms per call). Run it under the
shared benchmark lock; every round is bounded (wrk ``--seconds``), every process stopped.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shlex
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_scaleout as bs  # the throughput section's fleet, wrk driver and /proc meters


def requests_per_process(texts: Sequence[str]) -> dict[str, float]:
    """Requests answered so far, by the ``process`` label of a set's merged exposition."""
    out: dict[str, float] = {}
    for labels, v in bs.series(texts, "token_gateway_requests_total"):
        key = labels.get("process", "-")
        out[key] = out.get(key, 0.0) + v
    return out


async def prepare(gws: Sequence[bs.ServeProcess], canned: Any, fleet_pids: Sequence[int], nice: int) -> str:
    """Boost the measured processes, report the gateway's prompt count to the canned fleet, warm up."""
    for pid in (os.getpid(), *[g.process.pid for g in gws], *fleet_pids):
        bs.boost(pid, nice)
    async with httpx.AsyncClient(trust_env=False) as http:
        model: str = (await http.get(gws[0].url + "/v1/models")).json()["data"][0]["id"]
        probe = {"model": model, "messages": bs.short_prompts(1, 1)[0], "max_tokens": 8}
        usage = (await http.post(gws[0].url + "/v1/chat/completions", json=probe, timeout=30)).json()["usage"]
        canned.set_prompt_tokens(int(usage["prompt_tokens"]))
    for g in gws:
        await bs.many_clients(g.url, model, 1, 48, 300, 20, 1)
    return model


async def measure(gws: Sequence[bs.ServeProcess], model: str, conns: int, seconds: int, scratch: str) -> dict[str, Any]:
    """One round: wrk on every gateway in ``gws`` at once; req/s, CPU ms per request, split."""
    c0 = [bs.tree_cpu(g.process.pid) for g in gws]
    m0 = requests_per_process(await bs.scrape([g.url for g in gws]))
    tasks = [asyncio.ensure_future(bs.wrk_run(g.url, model, conns, seconds, scratch)) for g in gws]
    await asyncio.sleep(min(1.5, seconds / 2))
    spread: list[int] = []
    for g in gws:
        serving = sorted(c for c in bs.children(g.process.pid) if "gateway.server.serve" in bs.cmdline(c))
        if serving:
            spread += bs.connections_per_process(int(g.url.rsplit(":", 1)[1]), serving)
    outs = await asyncio.gather(*tasks)
    ok = sum(o[0] for o in outs)
    failed = sum(o[1] for o in outs)
    wall = max(o[2] for o in outs)
    ms = sum(bs.tree_cpu(g.process.pid) - c for g, c in zip(gws, c0, strict=True)) * 1e3 / max(ok, 1)
    m1 = requests_per_process(await bs.scrape([g.url for g in gws]))
    split = [round(m1[k] - m0.get(k, 0.0)) for k in sorted(m1)] if len(m1) > 1 else []
    return {"req_s": round(ok / wall, 1), "ms_per_request": round(ms, 3), "failed": failed,
            "connections": spread, "requests": split, "load_1m": round(os.getloadavg()[0], 2)}  # fmt: skip


def summary(rows: dict[str, list[dict[str, Any]]]) -> None:
    for name, v in rows.items():
        rs = sorted(x["req_s"] for x in v)
        ms = sorted(x["ms_per_request"] for x in v)
        print(f"{name}: median {rs[len(rs) // 2]} req/s, {ms[len(ms) // 2]} ms/request "
              f"(rounds {[x['req_s'] for x in v]}; {[x['ms_per_request'] for x in v]})")  # fmt: skip


async def run_pair(args: argparse.Namespace, urls: Sequence[str], canned: Any, fleet_pids: Sequence[int]) -> None:
    scratch = args.scratch
    one = await bs.ServeProcess.launch(bs.serve_argv(urls, scratch), "gw-one", ready_timeout_s=120)
    one_b = await bs.ServeProcess.launch(bs.serve_argv(urls, scratch), "gw-one-b", ready_timeout_s=120)
    two = await bs.ServeProcess.launch(bs.serve_argv(urls, scratch, "--processes", "2"), "gw-p2", ready_timeout_s=120)
    try:
        model = await prepare([one, one_b, two], canned, fleet_pids, args.nice)
        rows: dict[str, list[dict[str, Any]]] = {}
        for r in range(args.rounds):
            for name, gs, conns in (("one", [one], 48), ("processes-2", [two], 48), ("two-independent", [one, one_b], 24)):
                row = await measure(gs, model, conns, args.seconds, scratch)
                rows.setdefault(name, []).append(row)
                print(f"[pair round {r}] {name}: {row}", flush=True)
        summary(rows)
    finally:
        for g in (one, one_b, two):
            await g.stop(timeout_s=20)
            g.remove_log()


async def run_ab(args: argparse.Namespace, urls: Sequence[str], canned: Any, fleet_pids: Sequence[int]) -> None:
    scratch = args.scratch
    gws: dict[str, bs.ServeProcess] = {}
    try:
        for name, flags, src in (("A", args.a, args.src_a), ("B", args.b, args.src_b)):
            env = {**os.environ, "PYTHONPATH": src} if src else None
            argv = bs.serve_argv(urls, scratch, *shlex.split(flags))
            gws[name] = await bs.ServeProcess.launch(argv, f"gw-{name}", ready_timeout_s=120, env=env)
        model = await prepare(list(gws.values()), canned, fleet_pids, args.nice)
        rows: dict[str, list[dict[str, Any]]] = {"A": [], "B": []}
        for r in range(args.rounds):
            for name in ("A", "B") if r % 2 == 0 else ("B", "A"):
                row = await measure([gws[name]], model, 48, args.seconds, scratch)
                rows[name].append(row)
                print(f"[ab round {r}] {name}: {row}", flush=True)
        print(f"A: flags {args.a!r} src {args.src_a or '(this checkout)'}; B: flags {args.b!r} src {args.src_b or '(this checkout)'}")
        summary(rows)
    finally:
        for g in gws.values():
            await g.stop(timeout_s=20)
            g.remove_log()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("mode", choices=["pair", "ab"])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--seconds", type=int, default=8, help="one wrk round, s")
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--nice", type=int, default=-10, help="niceness of the measured processes (negative: root)")
    p.add_argument("--a", default="--processes 2", help="ab: gateway A's extra serve flags")
    p.add_argument("--b", default="--processes 2", help="ab: gateway B's extra serve flags")
    p.add_argument("--src-a", default="", help="ab: PYTHONPATH of gateway A (default: this checkout)")
    p.add_argument("--src-b", default="", help="ab: PYTHONPATH of gateway B (default: this checkout)")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        args.scratch = scratch
        fleet_args = argparse.Namespace(throughput_workers=args.workers, throughput_fleet_processes=1)
        with bs.throughput_fleet("canned", fleet_args) as (canned, urls, fleet_pids, _label):
            run = run_pair if args.mode == "pair" else run_ab
            asyncio.run(run(args, urls, canned, fleet_pids))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
