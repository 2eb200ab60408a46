#!/usr/bin/env python
"""Scale-out: one process, ``--processes 2``, and two replicas with and without routing sync.

    token-gateway bench scaleout                        # both sections
    token-gateway bench scaleout --sections routing --groups 16

``routing``: the full gsp workload (64 groups x 16 prompts, 2048-token system prompts,
128-token questions, 128 output tokens) on 8 simulated workers with 40k tokens of KV
each (a fresh fleet per setup), through

* ``one``: one ``serve`` process;
* ``processes-2``: ``serve --processes 2`` (its own nats-server, shared ports);
* ``processes-2-parked``: the same with ``--process-parking auto`` (the row adds when the
  set parked or woke a process during the run, read from ``/health``);
* ``replicas-sync``: two ``serve`` processes on two ports joined by ``--sync-url``;
* ``replicas-nosync``: the same two without sync.

``--variant cache_aware:knob=value,...`` gives every gateway of every setup those policy knobs.

For the replica pairs the client alternates requests between the two URLs (request i
goes to replica i % 2; each replica gets half the concurrency). Reported: hit rate next
to the ideal (an infinite shared cache), throughput, TTFT p50/p99, requests per worker,
and for synced setups the sync budgets read from ``/metrics``: bytes published per
request and the decision-to-remote-tree lag p50/p99 (interpolated in the histogram's
buckets).

``throughput``: short chat requests (non-streaming, unique prompts, 8 answer tokens) on
zero-cost workers, closed loop: requests/s of one process and of ``--processes 2``,
measured in alternating rounds in one run, with the machine's load average beside, and
per round where the CPU went (ms per request of each serving process, the supervisor,
nats-server, the simulated fleet, the load generator, the idle other gateway, and the
rest of the machine: everyone else's jobs) and how the load generator's connections
were spread over the serving processes. ``--throughput-fleet`` picks the zero-cost
workers: ``sim`` (simulated workers with every cost 0: Python, whose CPU per call is spent
on the gateway's cores) and/or ``canned`` (nginx answering canned gRPC replies,
``gateway_lab.bench.canned_fleet``: a small fraction of that, so the figure is the gateway's
own scaling). Besides the ratio of the medians it prints each round pair's ratio, the ratio
over quiet rounds (other processes under 0.1 ms of CPU per request) and the CPU-bound
ratio; ``--nice -10`` (root) puts the measured processes ahead of other jobs on a shared host.
``--throughput-parked`` adds, in the same alternated rounds, the set with ``--process-parking
auto`` (a process parked while the host has no spare core).

Every run is bounded in requests and seconds; every process started is stopped.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import itertools
import json
import math
import os
import random
import re
import sys
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import orjson
from prometheus_client.parser import text_string_to_metric_families

from gateway.sync.local_server import LocalNatsServer
from gateway_lab.bench import launch, ports
from gateway_lab.bench.driver import DriverConfig, RunResult, run_workload
from gateway_lab.bench.machine import cpu_seconds, describe
from gateway_lab.bench.placement import classify_misses
from gateway_lab.bench.report import summarize
from gateway_lab.bench.results import Result
from gateway_lab.bench.workloads import (
    GspConfig,
    Vocab,
    Workload,
    default_tokenizer_dir,
    gsp,
    ideal_hit_rate,
)
from gateway_lab.sim.config import SimConfig

SETUPS = ("one", "processes-2", "processes-2-parked", "replicas-sync", "replicas-sync-tokens", "replicas-nosync")
SECTIONS = ("routing", "throughput", "model")


def load_note() -> str:
    one, five, _ = os.getloadavg()
    return f"load {one:.1f}/{five:.1f}"


# ---------------------------------------------------------------- gateways


def serve_argv(urls: Sequence[str], scratch: str, *extra: str) -> list[str]:
    return [
        sys.executable, "-m", "gateway", "serve", "--worker-urls", *urls, "--policy", "cache_aware",
        "--host", "127.0.0.1", "--port", "0", "--log-level", "warning",
        "--tokenizer-path", str(default_tokenizer_dir()), "--tokenizer-cache-dir", scratch, *extra,
    ]  # fmt: skip


def start(urls: Sequence[str], scratch: str, name: str, *extra: str) -> contextlib.AbstractAsyncContextManager[launch.Gateway]:
    """One ``serve`` process of a setup, through the launcher (its shutdown may take a
    supervisor and its children down: 20 s before the kill)."""
    return launch.gateway(
        "ours", urls, "cache_aware", argv=serve_argv(urls, scratch, *extra), name=name, ready_timeout_s=120, stop_timeout_s=20,
    )  # fmt: skip


@contextlib.asynccontextmanager
async def gateways(setup: str, urls: Sequence[str], scratch: str, *knobs: str) -> AsyncIterator[list[launch.Gateway]]:
    """The setup's gateway process(es); their URLs are what the client drives. ``knobs``:
    more ``serve`` flags for every process (the policy variant's, ``--variant``)."""
    encoding = ["--sync-encoding", "tokens" if setup.endswith("-tokens") else "blocks"]
    async with contextlib.AsyncExitStack() as stack:
        if setup == "one":
            yield [await stack.enter_async_context(start(urls, scratch, "gw-one", *knobs))]
        elif setup.startswith("processes-2"):
            parking = ["--process-parking", "auto"] if setup.endswith("-parked") else []
            yield [await stack.enter_async_context(start(urls, scratch, "gw-p2", "--processes", "2", *encoding, *parking, *knobs))]
        else:
            extra: list[str] = [*knobs]
            if setup.startswith("replicas-sync"):
                nats = await LocalNatsServer().start()
                stack.push_async_callback(nats.stop)
                extra += ["--sync-url", nats.url, *encoding]
            yield [await stack.enter_async_context(start(urls, scratch, f"gw-r{i}", *extra)) for i in range(2)]


async def scrape(urls: Sequence[str]) -> list[str]:
    async with httpx.AsyncClient(trust_env=False, timeout=10) as http:
        return [(await http.get(u + "/metrics")).text for u in urls]


def series(texts: Sequence[str], name: str) -> list[tuple[dict[str, str], float]]:
    out: list[tuple[dict[str, str], float]] = []
    for text in texts:
        for fam in text_string_to_metric_families(text):
            out.extend((s.labels, s.value) for s in fam.samples if s.name == name)
    return out


def total(texts: Sequence[str], name: str) -> float:
    return sum(v for _, v in series(texts, name))


def histogram_quantile(texts: Sequence[str], name: str, q: float) -> float | None:
    """Prometheus-style quantile of a histogram summed over every process, in its unit."""
    buckets: dict[float, float] = {}
    for labels, v in series(texts, name + "_bucket"):
        le = float(labels["le"])
        buckets[le] = buckets.get(le, 0.0) + v
    if not buckets:
        return None
    edges = sorted(buckets)
    count = buckets[edges[-1]]
    if count <= 0:
        return None
    rank = q * count
    prev_edge, prev_count = 0.0, 0.0
    for edge in edges:
        c = buckets[edge]
        if c >= rank:
            if math.isinf(edge):
                return prev_edge
            span = c - prev_count
            return prev_edge + (edge - prev_edge) * ((rank - prev_count) / span if span else 0.0)
        prev_edge, prev_count = edge, c
    return prev_edge


# ---------------------------------------------------------------- routing (gsp)


def merge_runs(runs: Sequence[RunResult], label: str) -> RunResult:
    return replace(
        runs[0], label=label, results=[r for run in runs for r in run.results],
        wall_s=max(run.wall_s for run in runs), planned=sum(run.planned for run in runs),
    )


async def watch_active(url: str, changes: list[tuple[float, list[int]]], t0: float, every_s: float = 0.25) -> None:
    """Record each change of a process set's active processes (``/health``) as (seconds
    since ``t0``, active); runs until cancelled."""
    async with httpx.AsyncClient(trust_env=False, timeout=5) as http:
        while True:
            with contextlib.suppress(httpx.HTTPError, ValueError, KeyError, TypeError):
                active = list((await http.get(url + "/health")).json()["processes"]["active"])
                if not changes or changes[-1][1] != active:
                    changes.append((round(time.monotonic() - t0, 2), active))
            await asyncio.sleep(every_s)


def per_process(texts: Sequence[str], name: str) -> dict[str, float]:
    """A counter summed by its ``process`` label (a set's federated exposition)."""
    out: dict[str, float] = {}
    for labels, v in series(texts, name):
        key = labels.get("process", "-")
        out[key] = out.get(key, 0.0) + v
    return out


async def drive(urls: Sequence[str], workload: Workload, concurrency: int, cap_s: float, label: str) -> RunResult:
    """Request i goes to ``urls[i % len(urls)]``; each URL gets its share of the concurrency."""
    if len(urls) == 1:
        return await run_workload(urls[0], workload, DriverConfig(concurrency=concurrency, duration_s=cap_s), label=label)
    parts = [Workload(workload.name, workload.requests[i :: len(urls)]) for i in range(len(urls))]
    per = max(1, concurrency // len(urls))
    runs = await asyncio.gather(*(
        run_workload(u, part, DriverConfig(concurrency=per, duration_s=cap_s), label=label)
        for u, part in zip(urls, parts, strict=True)
    ))  # fmt: skip
    return merge_runs(runs, label)


def sync_budgets(texts: Sequence[str], requests: int) -> dict[str, Any]:
    published = total(texts, "token_gateway_sync_published_bytes_total")
    decisions = total(texts, "token_gateway_sync_published_decisions_total")
    batches = total(texts, "token_gateway_sync_published_batches_total")
    p50 = histogram_quantile(texts, "token_gateway_sync_lag_seconds", 0.5)
    p99 = histogram_quantile(texts, "token_gateway_sync_lag_seconds", 0.99)
    return {
        "published_bytes_per_request": round(published / max(1, requests), 1),
        "published_batches_per_request": round(batches / max(1, requests), 3),
        "decisions_published": int(decisions),
        "decisions_applied": int(total(texts, "token_gateway_sync_applied_decisions_total")),
        "decisions_unresolved": int(total(texts, "token_gateway_sync_unresolved_decisions_total")),
        "lost_batches": int(total(texts, "token_gateway_sync_lost_batches_total")),
        # decisions a sibling of one serve --processes N set applied from shared memory, before the bus copy
        "same_host_applied": int(total(texts, "token_gateway_sync_same_host_applied_total")),
        # siblings' requests in prefill each process's prefill gate heard of, and how many of them ended in the ring
        "same_host_prefill_heard": int(total(texts, "token_gateway_sync_same_host_prefill_heard_total")),
        "same_host_prefill_released": int(total(texts, "token_gateway_sync_same_host_prefill_released_total")),
        # ... and what a reader lost: decisions overwritten before it read them, requests in prefill dropped unreleased
        "same_host_overrun": int(total(texts, "token_gateway_sync_same_host_overrun_total")),
        "same_host_prefill_dropped": int(total(texts, "token_gateway_sync_same_host_prefill_dropped_total")),
        "lag_p50_ms": None if p50 is None else round(p50 * 1e3, 3),
        "lag_p99_ms": None if p99 is None else round(p99 * 1e3, 3),
    }


def variant_flags(variant: str) -> list[str]:
    """``cache_aware[:knob=value,...]`` (``launch.parse_variant``) as ``serve`` flags."""
    name, knobs = launch.parse_variant(variant)
    if name != "cache_aware":
        raise SystemExit(f"--variant {variant!r}: the routing section runs cache_aware (with knobs)")
    return launch.knob_flags(knobs)


async def routing_section(args: argparse.Namespace, report: dict[str, Any]) -> None:
    vocab = Vocab.from_tokenizer_dir()
    cfg = GspConfig(groups=args.groups, prompts_per_group=args.prompts_per_group, system_tokens=args.system_tokens,
                    question_tokens=args.question_tokens, output_tokens=args.output_tokens)  # fmt: skip
    workload = gsp(cfg, vocab, seed=args.seed)
    ideal = ideal_hit_rate(workload, page_size=args.page_size)
    sim = SimConfig(
        page_size=args.page_size, kv_capacity_tokens=args.kv_capacity_tokens, max_running_requests=16,
        step_base_s=0.01, prefill_token_s=0.0001, decode_seq_s=0.001, time_scale=1.0, seed=0,
    )  # fmt: skip
    rows: dict[str, Any] = {"setups": {}, "variant": args.variant}
    report["routing"] = rows
    rows["workload"] = {"groups": cfg.groups, "prompts_per_group": cfg.prompts_per_group, "system_tokens": cfg.system_tokens,
                        "question_tokens": cfg.question_tokens, "output_tokens": cfg.output_tokens,
                        "workers": args.workers, "kv_capacity_tokens": args.kv_capacity_tokens, "page_size": args.page_size,
                        "concurrency": args.concurrency, "ideal_hit_rate": round(ideal, 4)}  # fmt: skip
    scratch = args.scratch
    for setup in args.setups:
        async with launch.fleet("process", args.workers, sim) as fleet:
            async with gateways(setup, fleet.urls, scratch, *variant_flags(args.variant)) as gws:
                urls = [g.url for g in gws]
                t0 = time.monotonic()
                changes: list[tuple[float, list[int]]] = []
                watcher = asyncio.create_task(watch_active(urls[0], changes, t0)) if setup.startswith("processes") else None
                try:
                    run = await drive(urls, workload, args.concurrency, args.cap_s, setup)
                finally:
                    if watcher is not None:
                        watcher.cancel()
                        await asyncio.gather(watcher, return_exceptions=True)
                texts = await scrape(urls)
                wall = time.monotonic() - t0
        counters = fleet.counters or {}  # the workers report them as they stop
        run.worker_counters = {str(w["url"]): w for w in counters.get("workers", [])}
        s = summarize(run, ideal_hit_rate=ideal, worker_ids=list(run.worker_counters))
        row: dict[str, Any] = {
            "requests": s.requests, "ok": s.ok, "errors": s.errors, "not_sent": s.not_sent,
            "hit_rate": round(s.hit_rate, 4), "worker_hit_rate": None if s.worker_hit_rate is None else round(s.worker_hit_rate, 4),
            "ideal_hit_rate": round(ideal, 4), "req_s": round(s.req_s, 2), "output_tok_s": round(s.output_tok_s, 1),
            "ttft_p50_ms": None if s.ttft_p50_s is None else round(s.ttft_p50_s * 1e3, 1),
            "ttft_p99_ms": None if s.ttft_p99_s is None else round(s.ttft_p99_s * 1e3, 1),
            "requests_per_worker": sorted((int(w.get("requests", 0)) for w in run.worker_counters.values()), reverse=True),
            "wall_s": round(wall, 1), "first_errors": list(s.first_errors),
        }  # fmt: skip
        replicas = 2 if setup.startswith("replicas") else 1  # processes-2: one URL, the kernel splits connections
        misses = classify_misses(run.results, shared_tokens=cfg.system_tokens, replicas=replicas, lag_s=args.lag_window_s)
        row["placement"] = misses.as_dict()
        if setup.startswith(("processes-2", "replicas-sync")):
            row["sync"] = sync_budgets(texts, s.requests)
        if setup.startswith("processes"):
            row["active_changes"] = changes  # (s since the run began, processes taking connections)
            row["requests_by_process"] = {k: int(v) for k, v in sorted(per_process(texts, "token_gateway_requests_total").items())}
            for name in ("held", "timeouts"):
                row[f"gate_{name}_by_process"] = {
                    k: int(v) for k, v in sorted(per_process(texts, f"token_gateway_prefill_gate_{name}_total").items())
                }
            for name in ("given", "kept"):  # parking: connections passed on, and kept for want of a taker
                row[f"handoff_{name}_by_process"] = {
                    k: int(v) for k, v in sorted(per_process(texts, f"token_gateway_process_handoff_{name}_total").items())
                }
        rows["setups"][setup] = row
        print(f"[routing {setup}] ({load_note()}) " + json.dumps(row), flush=True)


# ---------------------------------------------------------------- throughput (short requests)


def short_prompts(n: int, seed: int) -> list[list[dict[str, str]]]:
    vocab = Vocab.from_tokenizer_dir()
    rng = random.Random(seed)
    # A zero-padded counter (one token per digit) and 24 one-token words: every prompt has
    # the same token count, which a canned fleet can report back (the fidelity guard).
    return [[{"role": "user", "content": f"{i:08d}{vocab.decode(vocab.sample(rng, 24))}"}] for i in range(n)]


async def closed_loop(url: str, model: str, prompts: list[list[dict[str, str]]], concurrency: int, requests: int,
                      cap_s: float) -> tuple[int, int, float]:  # fmt: skip
    """(ok, failed, seconds) of ``requests`` chat calls, ``concurrency`` at a time, bounded by ``cap_s``."""
    counter = itertools.count()
    ok = failed = 0
    deadline = time.perf_counter() + cap_s
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(trust_env=False, timeout=60, limits=limits) as http:

        async def caller() -> None:
            nonlocal ok, failed
            while time.perf_counter() < deadline:
                i = next(counter)
                if i >= requests:
                    return
                body = {"model": model, "messages": prompts[i % len(prompts)], "max_tokens": 8, "ignore_eos": True}
                try:
                    r = await http.post(url + "/v1/chat/completions", content=orjson.dumps(body),
                                        headers={"content-type": "application/json"})  # fmt: skip
                    if r.status_code == 200:
                        ok += 1
                    else:
                        failed += 1
                except httpx.HTTPError:
                    failed += 1

        t0 = time.perf_counter()
        await asyncio.gather(*(caller() for _ in range(concurrency)))
        return ok, failed, time.perf_counter() - t0


async def many_clients(url: str, model: str, clients: int, concurrency: int, requests: int, cap_s: float, seed: int) -> tuple[int, int, float]:
    """``closed_loop`` split over ``clients`` client processes (one Python client process
    cannot drive two gateway processes on a 2-core machine); (ok, failed, seconds)."""
    if clients <= 1:
        return await closed_loop(url, model, short_prompts(4096, seed), concurrency, requests, cap_s)
    procs = [
        await asyncio.create_subprocess_exec(
            sys.executable, "-m", __name__, "--client", url, "--client-model", model, "--seed", str(seed + i),
            "--throughput-concurrency", str(max(1, concurrency // clients)),
            "--throughput-requests", str(requests // clients), "--cap-s", str(cap_s),
            stdout=asyncio.subprocess.PIPE,
        )
        for i in range(clients)
    ]
    outs = [json.loads((await p.communicate())[0]) for p in procs]
    return sum(o["ok"] for o in outs), sum(o["failed"] for o in outs), max(o["seconds"] for o in outs)


WRK_SCRIPT = """
local counter = 0
local words = {%(words)s}
math.randomseed(%(seed)d)
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
request = function()
  counter = counter + 1
  local parts = {}
  for i = 1, 24 do parts[i] = words[math.random(#words)] end
  local body = '{"model":"%(model)s","messages":[{"role":"user","content":"' .. string.format("%%08d", counter) .. ' ' ..
    table.concat(parts, " ") .. '"}],"max_tokens":8,"ignore_eos":true}'
  return wrk.format(nil, "/v1/chat/completions", nil, body)
end
"""


def wrk_script(model: str, seed: int) -> str:
    """The Lua script of one wrk run: chat requests whose words are drawn from ``seed``."""
    vocab = Vocab.from_tokenizer_dir()
    words = sorted({t.strip() for t in vocab.texts.values() if t.strip().isascii() and t.strip().isalpha()})[:5000]
    return WRK_SCRIPT % {"words": ",".join(f'"{w}"' for w in words), "model": model, "seed": seed}


async def wrk_run(url: str, model: str, concurrency: int, seconds: float, scratch: str, seed: int = 0) -> tuple[int, int, float]:
    """(ok, failed, seconds) from ``wrk`` (a C load generator: its CPU per request is a small
    fraction of a Python client's, which matters when client and gateway share 2 cores).
    Every prompt is unique (a counter and random words), as with the Python client; each run
    draws its words from ``seed``, so that rounds with their own seed send prompts no earlier
    round sent (an unseeded generator replays one sequence: later rounds would hit the
    fleet's caches and the trees, each setup by its own history)."""
    script = Path(scratch) / "wrk_chat.lua"
    script.write_text(wrk_script(model, seed))
    proc = await asyncio.create_subprocess_exec(
        "wrk", "-t", "1", "-c", str(concurrency), "-d", f"{max(1, int(seconds))}s", "-s", str(script), url,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )
    out = (await proc.communicate())[0].decode()
    m = re.search(r"(\d+) requests in ([\d.]+)(m?s)", out)
    assert m is not None, out
    wall = float(m.group(2)) / (1000 if m.group(3) == "ms" else 1)
    bad = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    errors = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", out)
    failed = (int(bad.group(1)) if bad else 0) + (sum(int(x) for x in errors.groups()) if errors else 0)
    return int(m.group(1)) - failed, failed, wall


def children(pid: int) -> list[int]:
    with contextlib.suppress(OSError):
        return [int(c) for t in Path(f"/proc/{pid}/task").iterdir()
                for c in (t / "children").read_text().split()]  # fmt: skip
    return []


def tree_cpu(pid: int) -> float:
    """CPU seconds of ``pid`` and its children (a supervisor's serving processes)."""
    return cpu_seconds(pid) + sum(tree_cpu(c) for c in children(pid))


def cmdline(pid: int) -> str:
    with contextlib.suppress(OSError):
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    return ""


def gateway_parts(pid: int) -> dict[str, float]:
    """CPU seconds of a gateway's processes by role: ``serve`` (one process), or
    ``supervisor``, ``serve-0``, ``serve-1``... and ``nats-server`` for a set."""
    kids = children(pid)
    if not kids:
        return {"serve": cpu_seconds(pid)}
    out = {"supervisor": cpu_seconds(pid)}
    serving = sorted(c for c in kids if "gateway.server.serve" in cmdline(c))
    for i, c in enumerate(serving):
        out[f"serve-{i}"] = tree_cpu(c)
    for c in kids:
        if c not in serving:
            name = "nats-server" if "nats-server" in cmdline(c) else f"other-{c}"
            out[name] = out.get(name, 0.0) + tree_cpu(c)
    return out


def connections_per_process(port: int, pids: Sequence[int]) -> list[int]:
    """Established TCP connections on local ``port`` held by each of ``pids`` (/proc): how
    the kernel's SO_REUSEPORT hashing spread a load generator's keep-alive connections."""
    inodes: set[str] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError):
            for line in Path(table).read_text().splitlines()[1:]:
                f = line.split()
                if f[3] == "01" and int(f[1].rsplit(":", 1)[1], 16) == port:
                    inodes.add(f[9])
    out = []
    for pid in pids:
        n = 0
        with contextlib.suppress(OSError):
            for fd in Path(f"/proc/{pid}/fd").iterdir():
                with contextlib.suppress(OSError):
                    link = os.readlink(fd)
                    n += link.startswith("socket:[") and link[8:-1] in inodes
        out.append(n)
    return out


def descendants(pid: int) -> list[int]:
    out = []
    for c in children(pid):
        out += [c, *descendants(c)]
    return out


def boost(pid: int, nice: int) -> None:
    """Give ``pid``, its threads and its descendants niceness ``nice``, and their autogroups
    too: with the kernel's autogroup scheduling every session (each serving process,
    nats-server and nginx start their own) competes as one unit, whatever its members'
    niceness, so both are set. Negative values need root; failures are ignored."""
    if not nice:
        return
    for p in (pid, *descendants(pid)):
        with contextlib.suppress(OSError):
            Path(f"/proc/{p}/autogroup").write_text(str(nice))
        with contextlib.suppress(OSError):
            for task in Path(f"/proc/{p}/task").iterdir():
                with contextlib.suppress(OSError):
                    os.setpriority(os.PRIO_PROCESS, int(task.name), nice)


def machine_busy_s() -> float:
    """CPU seconds the whole machine has spent busy (every core, every process: /proc/stat)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


class CpuBreakdown:
    """CPU seconds over one round, per process of the measured setup and around it.

    Parts: the measured gateway's processes (``gateway_parts``), the simulated fleet
    process(es), the idle other gateway, this script, the load generator (the children it
    reaped during the round: ``RUSAGE_CHILDREN``), and ``rest of machine`` (everything
    else busy on the host: other people's jobs; it says how quiet the round was)."""

    def __init__(self, gateway: int, fleets: Sequence[int], idle: int | Sequence[int], fleet_label: str = "sim fleet") -> None:
        self.gateway, self.fleets, self.fleet_label = gateway, fleets, fleet_label
        self.idle = [idle] if isinstance(idle, int) else list(idle)

    def sample(self) -> dict[str, float]:
        import resource

        kids = resource.getrusage(resource.RUSAGE_CHILDREN)
        parts = {f"gateway {k}": v for k, v in gateway_parts(self.gateway).items()}
        for i, f in enumerate(self.fleets):
            parts[f"{self.fleet_label} {i}" if len(self.fleets) > 1 else self.fleet_label] = tree_cpu(f)
        parts["idle other gateway"] = sum(tree_cpu(p) for p in self.idle)
        parts["bench script"] = cpu_seconds(os.getpid())
        parts["load generator"] = kids.ru_utime + kids.ru_stime
        parts["machine"] = machine_busy_s()
        return parts

    @staticmethod
    def delta(before: dict[str, float], after: dict[str, float], requests: int) -> dict[str, float]:
        """ms of CPU per request, per part; ``rest of machine`` is the machine's busy time
        not accounted for by the other parts."""
        d = {k: after[k] - before.get(k, 0.0) for k in after}
        machine = d.pop("machine")
        d["rest of machine"] = max(0.0, machine - sum(d.values()))
        n = max(1, requests)
        return {k: round(1e3 * v / n, 3) for k, v in d.items()}


FLEETS = ("sim", "canned")
UNSYNCED = "processes-2-unsynced"  # --throughput-unsynced: the set with its NATS bus unreachable (no sync traffic)
PARKED = "processes-2-parked"  # --throughput-parked: the set with --process-parking auto (parks a process on a busy host)


QUIET_REST_MS = 0.1  # ms of other processes' CPU per request under which a round counts as quiet


@contextlib.asynccontextmanager
async def throughput_fleet(kind: str, args: argparse.Namespace) -> AsyncIterator[tuple[Any, list[str], list[int], str]]:
    """(the canned fleet or None, worker URLs, their process ids, the CPU-breakdown label) of
    the section's workers: ``sim``, simulated workers with every cost 0 (Python, grpc.aio: a
    few tenths of a ms of CPU per call on the same cores as the gateway), in
    ``--throughput-fleet-processes`` child processes, or ``canned``, nginx answering canned
    gRPC replies (``gateway_lab.bench.canned_fleet``: a few tens of microseconds per call)."""
    if kind == "canned":
        async with launch.fleet("canned", args.throughput_workers, output_tokens=8, max_running_requests=256) as canned:
            yield canned, canned.urls, [pid for pid in (canned.pid,) if pid is not None], "canned fleet (nginx)"
        return
    sim = SimConfig(step_base_s=0.0, prefill_token_s=0.0, decode_seq_s=0.0, time_scale=0.0, max_running_requests=256,
                    kv_capacity_tokens=65536)  # fmt: skip
    n_fleets = max(1, min(args.throughput_fleet_processes, args.throughput_workers))
    sizes = [args.throughput_workers // n_fleets + (1 if i < args.throughput_workers % n_fleets else 0) for i in range(n_fleets)]
    async with contextlib.AsyncExitStack() as stack:
        fleets = [await stack.enter_async_context(launch.fleet("process", n, sim)) for n in sizes]
        yield None, [u for f in fleets for u in f.urls], [f.proc.pid for f in fleets if f.proc is not None], "sim fleet"


async def fidelity(urls: Sequence[str]) -> dict[str, float]:
    """The tokenizer-fidelity guard's view over every serving process: finishes whose
    worker-reported prompt length differed from the gateway's, and pools routing by load only."""
    texts = await scrape(urls)
    return {"mismatches": total(texts, "token_gateway_tokenizer_mismatch_total"),
            "load_only_pools": total(texts, "token_gateway_routing_load_only")}  # fmt: skip


async def throughput_section(args: argparse.Namespace, report: dict[str, Any], kind: str = "sim") -> None:
    scratch = args.scratch
    rounds: dict[str, list[dict[str, Any]]] = {"one": [], "processes-2": []}
    loads: list[float] = []
    async with throughput_fleet(kind, args) as (canned, urls, fleet_pids, fleet_label), contextlib.AsyncExitStack() as stack:
        one = await stack.enter_async_context(start(urls, scratch, "gw-one"))
        two = await stack.enter_async_context(start(urls, scratch, "gw-p2", "--processes", "2"))
        gws = {"one": one, "processes-2": two}
        if args.throughput_parked:  # the same set parking a process while the host has no spare core
            rounds[PARKED] = []
            gws[PARKED] = await stack.enter_async_context(
                start(urls, scratch, "gw-p2p", "--processes", "2", "--process-parking", "auto")
            )
        if args.throughput_unsynced:  # the same set with its bus unreachable: what the set costs without the sync
            rounds[UNSYNCED] = []
            unreachable = f"nats://127.0.0.1:{ports.free_port()}"  # nothing listens there
            gws[UNSYNCED] = await stack.enter_async_context(
                start(urls, scratch, "gw-p2u", "--processes", "2", "--sync-url", unreachable)
            )
        for pid in (os.getpid(), *(g.pid for g in gws.values()), *fleet_pids):
            boost(pid, args.nice)
        async with httpx.AsyncClient(trust_env=False) as http:
            model = (await http.get(one.url + "/v1/models")).json()["data"][0]["id"]
            if canned is not None:  # report the gateway's own prompt count back, as a worker would
                probe = {"model": model, "messages": short_prompts(1, args.seed)[0], "max_tokens": 8}
                usage = (await http.post(one.url + "/v1/chat/completions", json=probe, timeout=30)).json()["usage"]
                canned.set_prompt_tokens(int(usage["prompt_tokens"]))
        for gw in gws.values():  # warm: connections, tokenizer caches, first-use costs
            await many_clients(gw.url, model, args.clients, args.throughput_concurrency, 200, 20, args.seed)
        for r in range(args.rounds):
            order = [(name, gw, [o.pid for o in gws.values() if o is not gw]) for name, gw in gws.items()]
            for name, gw, other in order if r % 2 == 0 else order[::-1]:
                loads.append(os.getloadavg()[0])
                meter = CpuBreakdown(gw.pid, fleet_pids, other, fleet_label)
                before = meter.sample()
                if args.load_generator == "wrk":
                    run = wrk_run(gw.url, model, args.throughput_concurrency, args.wrk_seconds, scratch,
                                  seed=1 + args.seed * 1000 + 10 * r + list(gws).index(name))
                else:
                    run = many_clients(gw.url, model, args.clients, args.throughput_concurrency,
                                       args.throughput_requests, args.cap_s, args.seed + r)  # fmt: skip
                task = asyncio.ensure_future(run)
                serving = sorted(c for c in children(gw.pid) if "gateway.server.serve" in cmdline(c))
                spread: list[int] = []
                with contextlib.suppress(TimeoutError):  # the load generator's connections, mid-round
                    await asyncio.wait_for(asyncio.shield(task), timeout=1.0)
                if serving and not task.done():
                    spread = connections_per_process(int(gw.url.rsplit(":", 1)[1]), serving)
                ok, failed, wall = await task
                cpu = CpuBreakdown.delta(before, meter.sample(), ok)
                gateway_ms = sum(v for k, v in cpu.items() if k.startswith("gateway "))
                row = {"ok": ok, "failed": failed, "seconds": round(wall, 2), "req_s": round(ok / wall, 1),
                       "gateway_cpu_ms_per_request": round(gateway_ms, 3), "cpu_ms_per_request": cpu}  # fmt: skip
                if spread:
                    row["connections_per_process"] = spread
                rounds[name].append(row)
                print(f"[throughput {kind} {name} round {r}] ({load_note()}) {row}", flush=True)
        guard = {name: await fidelity([gw.url]) for name, gw in gws.items()}

    def med(name: str) -> float:
        vals = sorted(x["req_s"] for x in rounds[name])
        return vals[len(vals) // 2]

    pairs = [round(b["req_s"] / a["req_s"], 2) for a, b in zip(rounds["one"], rounds["processes-2"], strict=False) if a["req_s"]]

    def quiet(name: str) -> list[float]:
        """req/s of the rounds in which the rest of the machine (other people's jobs) took
        under QUIET_REST_MS per request: the rounds that measured this setup alone."""
        return sorted(x["req_s"] for x in rounds[name] if x["cpu_ms_per_request"].get("rest of machine", 0.0) <= QUIET_REST_MS)

    q1, q2 = quiet("one"), quiet("processes-2")

    def own_ms(row: dict[str, Any]) -> float:
        """CPU ms per request of this benchmark's own processes (everything but the rest of the machine)."""
        return sum(v for k, v in row["cpu_ms_per_request"].items() if k != "rest of machine")

    # What the CPU accounting allows, less sensitive to other people's jobs on the host: one
    # serving process is bound by its interpreter (the cores it used in its quietest round),
    # two by the machine's cores over everything the benchmark runs per request.
    g1 = sorted(x["gateway_cpu_ms_per_request"] for x in rounds["one"])[len(rounds["one"]) // 2]
    quietest = min(rounds["one"], key=lambda x: x["cpu_ms_per_request"].get("rest of machine", 0.0))
    one_cores = quietest["req_s"] * quietest["gateway_cpu_ms_per_request"] / 1e3
    c2 = sorted(own_ms(x) for x in rounds["processes-2"])[len(rounds["processes-2"]) // 2]
    cores = os.cpu_count() or 1
    cpu_bound = {"one_process_cores": round(one_cores, 3), "gateway_ms_one": g1,
                 "one_round_rest_of_machine_ms": quietest["cpu_ms_per_request"].get("rest of machine", 0.0), "own_ms_processes_2": round(c2, 3),
                 "cores": cores, "ratio": round((cores * 1e3 / c2) / (one_cores * 1e3 / g1), 2)}  # fmt: skip
    out = {
        "fleet": kind, "workers": args.throughput_workers, "concurrency": args.throughput_concurrency,
        "fleet_processes": 1 if kind == "canned" else max(1, min(args.throughput_fleet_processes, args.throughput_workers)),
        "client_processes": args.clients,
        "load_generator": args.load_generator,
        "requests_per_round": args.throughput_requests, "wrk_seconds": args.wrk_seconds, "rounds": rounds,
        "median_req_s": {name: med(name) for name in rounds},
        "ratio": round(med("processes-2") / med("one"), 2) if med("one") else None,
        "round_pair_ratios": pairs,
        "quiet_rounds": {"one": q1, "processes-2": q2},
        "quiet_ratio": round(q2[len(q2) // 2] / q1[len(q1) // 2], 2) if q1 and q2 else None,
        "cpu_bound": cpu_bound,
        **({"unsynced_ratio": round(med(UNSYNCED) / med("one"), 2) if med("one") else None} if UNSYNCED in rounds else {}),
        **({"parked_ratio": round(med(PARKED) / med("one"), 2) if med("one") else None,
            "parked_round_pair_ratios": [round(b["req_s"] / a["req_s"], 2) for a, b in zip(rounds["one"], rounds[PARKED], strict=False)
                                         if a["req_s"]]} if PARKED in rounds else {}),
        "load_1m_seen": [round(x, 1) for x in loads],
        "fidelity_guard": guard,
    }  # fmt: skip
    report["throughput" if kind == "sim" else f"throughput-{kind}"] = out
    print(f"[throughput {kind}] ratio processes-2 / one = {out['ratio']} (round pairs {pairs}; quiet rounds "
          f"{out['quiet_ratio']}: {q1} / {q2}); CPU-bound ratio {cpu_bound}; fidelity guard {guard}", flush=True)  # fmt: skip


# ---------------------------------------------------------------- model: 16 replicas, 256 workers


def model_section(args: argparse.Namespace, report: dict[str, Any]) -> None:
    """Measure the per-decision costs on this machine, then project them to a bigger fleet.

    In memory, no servers: gsp prompts (the bench's shape) are published by one outbox and
    applied by another process's applier (real CacheAwarePolicy trees over ``--model-workers``
    workers), in both encodings. The projection assumes ``--model-rate`` requests/s per
    replica and every replica hearing every other (one NATS subject).
    """
    from types import SimpleNamespace

    from gateway.policies.base import Decision, RouteRequest, WorkerView
    from gateway.policies.cache_aware import CacheAwarePolicy
    from gateway.sync.apply import Applier
    from gateway.sync.outbox import Outbox
    from gateway.sync.prefix_book import PrefixBook
    from gateway.workers.load import WorkerLoad

    n_workers, replicas, rate = args.model_workers, args.model_replicas, args.model_rate
    ids = [f"10.0.{i // 250}.{i % 250}:30000" for i in range(n_workers)]
    workers = {w: SimpleNamespace(id=w, model="m", role="regular", load=WorkerLoad(in_flight=1, queued_prefill_tokens=2000),
                                  remote_load=WorkerLoad(), info=SimpleNamespace(page_size=16)) for w in ids}  # fmt: skip

    class Workers:
        def get(self, wid: str) -> Any:
            return workers.get(wid)

        def all(self) -> list[Any]:
            return list(workers.values())

    vocab = Vocab.from_tokenizer_dir()
    cfg = GspConfig(groups=args.groups, prompts_per_group=args.prompts_per_group, system_tokens=args.system_tokens,
                    question_tokens=args.question_tokens, output_tokens=args.output_tokens)  # fmt: skip
    prompts = [list(r.prompt_token_ids or ()) for r in gsp(cfg, vocab, seed=args.seed).requests]
    rng = random.Random(args.seed)
    out: dict[str, Any] = {"workers": n_workers, "replicas": replicas, "rate_per_replica": rate, "encodings": {}}
    for encoding in ("tokens", "blocks"):
        book_a = PrefixBook() if encoding == "blocks" else None
        book_b = PrefixBook() if encoding == "blocks" else None
        policy = CacheAwarePolicy(eviction_interval_s=0)
        policy.on_workers_changed([WorkerView(w, w, kv_capacity_tokens=40960, page_size=16) for w in ids])

        class Router:
            def __init__(self, p: CacheAwarePolicy) -> None:
                self.p = p

            def policy(self, model: str, role: str) -> CacheAwarePolicy:
                return self.p

        box = Outbox("a", lambda wid: workers[wid].load, lambda wid: 16, book=book_a)
        applier = Applier("b", Router(policy), Workers(), book=book_b)
        sizes: list[int] = []
        t_encode = t_apply = 0.0
        for i, prompt in enumerate(prompts):
            wid = ids[rng.randrange(n_workers)]
            t0 = time.perf_counter()
            box.dispatched("regular", RouteRequest(prompt, model="m", request_id=str(i)), Decision(wid, "no_match"))
            data = box.take()
            assert data is not None
            raw = data.SerializeToString()
            t1 = time.perf_counter()
            applier.apply_bytes(raw)
            t2 = time.perf_counter()
            sizes.append(len(raw))
            t_encode += t1 - t0
            t_apply += t2 - t1
        n = len(prompts)
        per_req = sum(sizes) / n
        heartbeat = 4 * 0.5 * n_workers * 12 + n_workers * 30  # changed half of the workers per beat; a full list per s
        published = rate * per_req + heartbeat
        received = (replicas - 1) * published
        apply_cpu = (replicas - 1) * rate * (t_apply / n)
        out["encodings"][encoding] = {
            "bytes_per_request": round(per_req, 1),
            "encode_us": round(1e6 * t_encode / n, 1),
            "apply_us": round(1e6 * t_apply / n, 1),
            "unresolved": applier.stats.unresolved,
            "per_replica_published_kB_s": round(published / 1e3, 1),
            "per_replica_received_MB_s": round(received / 1e6, 2),
            "nats_egress_MB_s": round(replicas * received / 1e6, 1),
            "per_replica_apply_cpu_share": round(apply_cpu, 3),
        }
        print(f"[model {encoding}] {out['encodings'][encoding]}", flush=True)
    report["model"] = out


# ---------------------------------------------------------------- markdown


def cpu_table(rounds: dict[str, list[dict[str, Any]]]) -> list[str]:
    """Median CPU ms per request of each part, per setup (the rounds' ``cpu_ms_per_request``)."""
    names = [n for n, rows in rounds.items() if rows and "cpu_ms_per_request" in rows[0]]
    if not names:
        return []
    parts: list[str] = []
    for n in names:
        parts += [k for k in rounds[n][0]["cpu_ms_per_request"] if k not in parts]

    def med(n: str, part: str) -> float | None:
        vals = sorted(r["cpu_ms_per_request"][part] for r in rounds[n] if part in r["cpu_ms_per_request"])
        return vals[len(vals) // 2] if vals else None

    lines = ["CPU ms per request by process (median of the rounds):", "",
             "| process | " + " | ".join(names) + " |", "| --- |" + " --- |" * len(names)]  # fmt: skip
    for part in parts:
        lines.append(f"| {part} | " + " | ".join("-" if (v := med(n, part)) is None else f"{v:.3f}" for n in names) + " |")
    def med_total(n: str) -> float:
        vals = sorted(sum(v for k, v in r["cpu_ms_per_request"].items() if k != "rest of machine") for r in rounds[n])
        return vals[len(vals) // 2]

    lines += ["| total, this benchmark's processes | " + " | ".join(f"{med_total(n):.3f}" for n in names) + " |", ""]
    return lines


def throughput_markdown(tp: dict[str, Any]) -> list[str]:
    """The throughput section's tables, for one fleet."""
    lines: list[str] = []
    fleet = tp.get("fleet", "sim")
    workers = "zero-cost simulated workers" if fleet == "sim" else "canned nginx workers (gateway_lab.bench.canned_fleet)"
    wrk = tp.get("load_generator") == "wrk" and "wrk_seconds" in tp
    per_round = f"{tp['wrk_seconds']:g} s rounds" if wrk else f"{tp['requests_per_round']} requests per round"
    lines += [
        f"Short chat requests (8 answer tokens, unique ~30-token prompts), {tp['workers']} {workers}, "
        f"concurrency {tp['concurrency']} from "
        f"{'wrk' if tp.get('load_generator') == 'wrk' else str(tp.get('client_processes', 1)) + ' Python client processes'}, "
        f"{per_round}, rounds alternating:",
        "",
        "| setup | req/s per round | median req/s | gateway CPU ms/request (median) |",
        "| --- | --- | --- | --- |",
    ]
    for name, rows in tp["rounds"].items():
        cpu = sorted(x["gateway_cpu_ms_per_request"] for x in rows)[len(rows) // 2]
        lines.append(f"| {name} | {' '.join(str(x['req_s']) for x in rows)} | {tp['median_req_s'][name]} | {cpu} |")
    lines += ["", f"Ratio processes-2 / one (medians): **{tp['ratio']}**; 1-minute load average seen: {tp['load_1m_seen']}.", ""]
    if tp.get("parked_ratio") is not None:
        lines += [f"Ratio {PARKED} / one (the set parking a process on a busy host): {tp['parked_ratio']} "
                  f"(round pairs {tp['parked_round_pair_ratios']}).", ""]  # fmt: skip
    if tp.get("unsynced_ratio") is not None:
        lines += [f"Ratio {UNSYNCED} / one (the set without sync traffic): {tp['unsynced_ratio']}.", ""]
    if "round_pair_ratios" in tp:
        lines += [f"Per round pair: {tp['round_pair_ratios']}; rounds with under {QUIET_REST_MS} ms/request of other "
                  f"processes' CPU: {tp['quiet_rounds']}, ratio {tp['quiet_ratio']}.", ""]  # fmt: skip
    cb = tp.get("cpu_bound")
    if cb:
        lines += [f"CPU-bound ratio ({cb['cores']} cores / {cb['own_ms_processes_2']} ms of this benchmark's CPU per "
                  f"request with two processes, against one process at {cb['one_process_cores']} cores in its quietest round "
                  f"(other processes {cb.get('one_round_rest_of_machine_ms')} ms/request) / "
                  f"{cb['gateway_ms_one']} ms): **{cb['ratio']}**.", ""]  # fmt: skip
    spreads = [r["connections_per_process"] for r in tp["rounds"].get("processes-2", []) if r.get("connections_per_process")]
    if spreads:
        lines += ["Load-generator connections per serving process (SO_REUSEPORT spread), per round: "
                  + ", ".join("/".join(map(str, x)) for x in spreads) + ".", ""]  # fmt: skip
    lines += cpu_table(tp["rounds"])
    g = tp.get("fidelity_guard")
    if g:
        lines += [f"Tokenizer-fidelity guard after the rounds (mismatched finishes, load-only pools): {g}.", ""]
    return lines


def markdown(report: dict[str, Any]) -> str:
    lines: list[str] = []
    routing = report.get("routing")
    if routing:
        w = routing["workload"]
        lines += [
            f"gsp {w['groups']}x{w['prompts_per_group']}, {w['system_tokens']}-token system prompts, "
            f"{w['question_tokens']}-token questions, {w['output_tokens']} output tokens; {w['workers']} simulated workers, "
            f"{w['kv_capacity_tokens']} KV tokens each, page {w['page_size']}; concurrency {w['concurrency']}.",
            "",
            "| setup | hit rate (ideal) | req/s | output tok/s | TTFT p50 / p99 ms | requests per worker | sync bytes/request "
            "| sync lag p50 / p99 ms | prefix misses: first / blind new holder / informed new holder / duplicate / evicted "
            "| holders per group mean (max) |",
            "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
        ]
        for name, r in routing["setups"].items():
            sync = r.get("sync") or {}
            lag = f"{sync['lag_p50_ms']} / {sync['lag_p99_ms']}" if sync else "-"
            pl = r.get("placement") or {}
            miss = " / ".join(str(v) for v in pl.get("misses", {}).values()) or "-"
            holders = f"{pl['holders_mean']} ({pl['holders_max']})" if pl else "-"
            lines.append(
                f"| {name} | {100 * r['hit_rate']:.1f}% ({100 * r['ideal_hit_rate']:.1f}%) | {r['req_s']} | {r['output_tok_s']} | "
                f"{r['ttft_p50_ms']} / {r['ttft_p99_ms']} | {' '.join(map(str, r['requests_per_worker']))} | "
                f"{sync.get('published_bytes_per_request', '-')} | {lag} | {miss} | {holders} |"
            )
        lines.append("")
    for key in ("throughput", *(f"throughput-{k}" for k in FLEETS if k != "sim")):
        if report.get(key):
            lines += throughput_markdown(report[key])
    model = report.get("model")
    if model:
        lines += [
            f"Projection: {model['replicas']} replicas, {model['workers']} workers, {model['rate_per_replica']} gsp requests/s per replica:",
            "",
            "| encoding | bytes/request | encode µs | apply µs | published kB/s per replica | received MB/s per replica | NATS egress MB/s | apply CPU per replica (cores) |",
            "| --- | --- | --- | --- | --- | --- | --- | --- |",
        ]
        for name, m in model["encodings"].items():
            lines.append(
                f"| {name} | {m['bytes_per_request']} | {m['encode_us']} | {m['apply_us']} | {m['per_replica_published_kB_s']} | "
                f"{m['per_replica_received_MB_s']} | {m['nats_egress_MB_s']} | {m['per_replica_apply_cpu_share']} |"
            )
        lines.append("")
    return "\n".join(lines)


# ---------------------------------------------------------------- main


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The scenario's flags (``token-gateway bench NAME --help``)."""
    p.add_argument("--sections", nargs="+", choices=SECTIONS, default=list(SECTIONS))
    p.add_argument("--setups", nargs="+", choices=SETUPS, default=list(SETUPS))
    p.add_argument("--groups", type=int, default=64)
    p.add_argument("--prompts-per-group", type=int, default=16)
    p.add_argument("--system-tokens", type=int, default=2048)
    p.add_argument("--question-tokens", type=int, default=128)
    p.add_argument("--output-tokens", type=int, default=128)
    p.add_argument("--workers", type=int, default=8)
    p.add_argument("--kv-capacity-tokens", type=int, default=40960)
    p.add_argument("--page-size", type=int, default=16)
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--variant", default="cache_aware",
                   help="routing: every gateway's policy, cache_aware[:knob=value,...] as in bench matrix --policies")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--cap-s", type=float, default=240.0, help="wall-time limit of one run, s")
    p.add_argument("--lag-window-s", type=float, default=0.05,
                   help="routing: a replica is taken not to know of another's placement younger than this (miss breakdown)")
    p.add_argument("--throughput-workers", type=int, default=4)
    p.add_argument("--throughput-fleet-processes", type=int, default=1,
                   help="simulated-worker processes the throughput section's workers are spread over")
    p.add_argument("--throughput-fleet", nargs="+", choices=FLEETS, default=["sim"],
                   help="throughput section's workers: sim (simulated, Python) and/or canned (nginx, canned replies)")
    p.add_argument("--throughput-concurrency", type=int, default=32)
    p.add_argument("--throughput-requests", type=int, default=1500)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--throughput-parked", action="store_true",
                   help="also measure --processes 2 with --process-parking auto (a process parked while the host has no spare core)")
    p.add_argument("--throughput-unsynced", action="store_true",
                   help="also measure --processes 2 with its sync bus unreachable (the set's cost without the routing sync)")
    p.add_argument("--clients", type=int, default=2, help="client processes of the throughput section (python)")
    p.add_argument("--load-generator", choices=["python", "wrk"], default="python",
                   help="throughput client: httpx processes, or wrk (Debian package; far less CPU per request)")
    p.add_argument("--wrk-seconds", type=float, default=8.0, help="length of one wrk round, s")
    p.add_argument("--nice", type=int, default=0,
                   help="throughput section: niceness (and autogroup niceness) of the measured processes; negative "
                        "needs root: on a shared host, -10 lets them take the cores ahead of other people's jobs")
    p.add_argument("--client", default="", help=argparse.SUPPRESS)  # internal: be one client process
    p.add_argument("--client-model", default="", help=argparse.SUPPRESS)
    p.add_argument("--model-workers", type=int, default=256)
    p.add_argument("--model-replicas", type=int, default=16)
    p.add_argument("--model-rate", type=float, default=100.0, help="requests/s per replica in the projection")
    p.add_argument("--scratch", default="bench_scratch")
    p.add_argument("--json", default="", help="write the report as JSON here")
    p.add_argument("--markdown", default="", help="write the tables as Markdown here")
    p.add_argument("--from-json", default="", help="only render --markdown from a report written by --json")


def main(args: argparse.Namespace) -> int:
    """Run the scenario with parsed flags; the exit status."""
    if args.client:
        ok, failed, wall = asyncio.run(closed_loop(
            args.client, args.client_model, short_prompts(4096, args.seed), args.throughput_concurrency,
            args.throughput_requests, args.cap_s,
        ))  # fmt: skip
        print(json.dumps({"ok": ok, "failed": failed, "seconds": wall}))
        return 0
    if args.from_json:
        text = markdown(json.loads(Path(args.from_json).read_text()))
        if args.markdown:
            Path(args.markdown).write_text(text)
        print(text)
        return 0
    Path(args.scratch).mkdir(exist_ok=True)
    args.scratch = str(Path(args.scratch).resolve())
    report: dict[str, Any] = {"machine": describe(), "date": datetime.date.today().isoformat(), "argv": sys.argv[1:],
                              "load_before": [round(x, 1) for x in os.getloadavg()], "nice": args.nice}  # fmt: skip
    if "routing" in args.sections:
        asyncio.run(routing_section(args, report))
    if "throughput" in args.sections:
        for kind in args.throughput_fleet:
            asyncio.run(throughput_section(args, report, kind))
    if "model" in args.sections:
        model_section(args, report)
    text = json.dumps(report, indent=2)
    if args.json:
        Path(args.json).write_text(text)
    if args.markdown:
        Path(args.markdown).write_text(markdown(report))
    print(text)
    verdict = judge(report)
    for reason in verdict.invalid:
        print(f"INVALID run: {reason}", file=sys.stderr)
    return verdict.exit_status


def judge(report: dict[str, Any]) -> Result:
    """The report under the rule every benchmark exits by: a failed request in a routing
    setup or a throughput round makes the run invalid."""
    verdict = Result(machine={})
    for setup, row in report.get("routing", {}).get("setups", {}).items():
        verdict.count_failed(f"routing {setup}", row["errors"], row["requests"])
    for key, section in report.items():
        if key.startswith("throughput"):
            for name, rounds in section["rounds"].items():
                for i, r in enumerate(rounds):
                    verdict.count_failed(f"{key} {name} round {i}", r["failed"], r["ok"] + r["failed"])
    return verdict


if __name__ == "__main__":  # one client process of the throughput section (main() starts them)
    _parser = argparse.ArgumentParser()
    add_arguments(_parser)
    raise SystemExit(main(_parser.parse_args()))
