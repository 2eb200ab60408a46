"""`token-gateway bench elastic`: a fleet that grows and shrinks under load (4 -> 8 -> 6).

    token-gateway bench elastic --trace conversation_trace.jsonl --policies cache_aware prefix_hash

Each policy replays the same timed workload twice on a fresh simulated fleet with an
in-process gateway: once *steady* (the first ``start_workers`` workers throughout) and
once *elastic*: at ``add_at_s`` the gateway registers the rest of the fleet's workers
(``peak_workers``) under load, and at ``remove_at_s`` removes workers down to
``end_workers`` (the first of the original ones: their tree entries must go at once).

What it reports, per policy and fleet build:

* time to fair share: seconds from the add until every new worker started at least
  ``fair_share`` of the mean request count of the live workers over the last
  ``window_s`` seconds (how long new capacity sits idle);
* hit rate while the fleet changes (requests started in ``[add_at_s, add_at_s + 30 s)``),
  elastic against steady, overall and for the original workers only: adding workers must
  not cost the others their hits;
* hit rate after the removal and overall, and errors (a removal must fail no request).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gateway.settings import add_options, from_namespace, option
from gateway_lab.bench.trace_bench import FLEETS, FleetShape, matrix_config
from gateway_lab.bench.traces import TraceConfig, load_trace_workload

CHANGE_WINDOW_S = 30.0


@dataclass(slots=True)
class ElasticConfig:
    """The workload, the fleet sizes and when they change."""

    trace: str = option("", "trace to replay (Mooncake JSONL or JSONL prompts with timestamps)")
    policies: list[str] = option(["cache_aware", "prefix_hash"], "policies to compare (NAME:knob=value,...)")
    fleets: list[str] = option(["sim"], "fleet builds to run on", choices=list(FLEETS))
    start_workers: int = option(4, "workers at the start (and throughout the steady run)")
    peak_workers: int = option(8, "workers once the new ones are added")
    end_workers: int = option(6, "workers after the removal")
    add_at_s: float = option(20.0, "seconds into the run when the new workers are added")
    remove_at_s: float = option(50.0, "seconds into the run when workers are removed")
    window_s: float = option(10.0, "window over which a worker's share of requests is measured, s")
    fair_share: float = option(0.8, "a new worker has its fair share at this fraction of the live workers' mean")
    per_worker_concurrency: int = option(32, "requests in flight per worker at most")
    time_scale_sim: float = option(1.0, "wall seconds per simulated second of the workers")
    run_timeout_s: float = option(600.0, "wall-time limit of one run, s")
    json_out: str = option("", "write the figures as JSON to this file", flag="--json")
    markdown: str = option("", "write the table as Markdown to this file")

    def __post_init__(self) -> None:
        if not 1 <= self.end_workers <= self.peak_workers or not 1 <= self.start_workers <= self.peak_workers:
            raise ValueError("need 1 <= start, end <= peak workers")
        if not 0 <= self.add_at_s <= self.remove_at_s:
            raise ValueError("need 0 <= add_at_s <= remove_at_s")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_options(parser.add_argument_group("elastic bench"), ElasticConfig)
    add_options(parser.add_argument_group("trace scaling"), TraceConfig)
    parser.set_defaults(trace_requests=1000)


# ---------------------------------------------------------------------------- figures


def hit_rate(results: list[Any], lo: float, hi: float, workers: set[str] | None = None) -> float | None:
    """Cached / prompt tokens of the successful requests started in ``[lo, hi)`` (on ``workers``)."""
    prompt = cached = 0
    for r in results:
        if r.ok and lo <= r.start_s < hi and (workers is None or r.worker_id in workers):
            prompt += r.prompt_tokens
            cached += r.cached_tokens
    return cached / prompt if prompt else None


def time_to_fair_share(
    results: list[Any], new: set[str], live: set[str], added_at: float, *, window_s: float, fair_share: float,
    until: float, step_s: float = 1.0,
) -> float | None:
    """Seconds from ``added_at`` until every ``new`` worker started ``fair_share`` of the mean
    request count of the ``live`` workers over the trailing ``window_s`` (None: never before ``until``)."""
    starts = sorted((r.start_s, r.worker_id) for r in results if r.worker_id)
    t = added_at + step_s
    while t <= until:
        lo = max(added_at, t - window_s)
        counts = Counter(w for s, w in starts if lo <= s < t and w in live)
        mean = sum(counts.values()) / len(live) if live else 0.0
        if mean > 0 and all(counts[w] >= fair_share * mean for w in new):
            return t - added_at
        t += step_s
    return None


@dataclass(slots=True)
class ElasticRun:
    fleet: str
    policy: str
    elastic: bool
    summary: Any  # report.RunSummary
    results: list[Any]
    original: list[str]
    added: list[str]
    removed: list[str]
    added_at: float = 0.0
    removed_at: float = 0.0
    wall_s: float = 0.0


async def run_one(
    workload: Any, policy: str, shape: FleetShape, config: ElasticConfig, tokenizer_dir: str, scratch: str,
    *, fleet_name: str, elastic: bool,
) -> ElasticRun:
    """One run on a fresh fleet of ``peak_workers``, the gateway starting with ``start_workers``."""
    from gateway_lab.bench import launch
    from gateway_lab.bench.driver import DriverConfig, run_workload
    from gateway_lab.bench.inprocess import serve_in_process
    from gateway_lab.bench.matrix import sim_config
    from gateway_lab.bench.report import summarize

    mc = matrix_config(_as_trace_bench(config), shape)
    driver = DriverConfig(
        concurrency=config.per_worker_concurrency * config.peak_workers, duration_s=config.run_timeout_s,
        request_timeout_s=120.0,
    )  # fmt: skip
    async with launch.fleet("sim", config.peak_workers, sim_config(mc)) as fleet:
        urls = fleet.urls
        gw = launch.ours_config(urls[: config.start_workers], policy, tokenizer_dir, scratch)
        async with serve_in_process(gw) as served:
            state = served.state
            original = [w.id for w in state.registry.all()]
            out = ElasticRun(fleet_name, policy, elastic, None, [], original, [], [])
            t0 = time.perf_counter()

            async def churn() -> None:
                await asyncio.sleep(max(0.0, t0 + config.add_at_s - time.perf_counter()))
                out.added_at = time.perf_counter() - t0
                added = await asyncio.gather(*(state.add_worker(u) for u in urls[config.start_workers :]))
                out.added = [w.id for w in added]
                await asyncio.sleep(max(0.0, t0 + config.remove_at_s - time.perf_counter()))
                out.removed_at = time.perf_counter() - t0
                out.removed = original[: config.peak_workers - config.end_workers]
                await asyncio.gather(*(state.remove_worker(w) for w in out.removed))

            task = asyncio.create_task(churn()) if elastic else None
            try:
                run = await run_workload(served.url, workload, driver, label=policy)
            finally:
                if task is not None:
                    if not task.done():
                        task.cancel()
                    await asyncio.gather(task, return_exceptions=True)
            out.wall_s = time.perf_counter() - t0
    out.results = run.results
    out.summary = summarize(run)
    return out


def _as_trace_bench(config: ElasticConfig) -> Any:
    from gateway_lab.bench.trace_bench import TraceBenchConfig

    return TraceBenchConfig(
        trace=config.trace, policies=list(config.policies), workers=config.peak_workers,
        per_worker_concurrency=config.per_worker_concurrency, time_scale_sim=config.time_scale_sim,
        run_timeout_s=config.run_timeout_s,
    )  # fmt: skip


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


HEADER = [
    "fleet", "policy", "time to fair share s", "hit while changing: elastic / steady",
    "original workers only: elastic / steady", "hit after removal: elastic / steady", "hit overall: elastic / steady",
    "errors (elastic)",
]  # fmt: skip


def row(elastic: ElasticRun, steady: ElasticRun, config: ElasticConfig) -> list[str]:
    e, s = elastic.results, steady.results
    lo, hi = elastic.added_at, elastic.added_at + CHANGE_WINDOW_S
    end = max((r.start_s for r in e), default=0.0)
    live_after_add = set(elastic.original) | set(elastic.added)
    fair = time_to_fair_share(
        e, set(elastic.added), live_after_add, elastic.added_at, window_s=config.window_s,
        fair_share=config.fair_share, until=min(end, elastic.removed_at or end),
    )  # fmt: skip
    orig = set(elastic.original)
    steady_orig = set(steady.original)  # every run has a fresh fleet: its own worker ids
    return [
        elastic.fleet, elastic.policy, "never" if fair is None else f"{fair:.0f}",
        f"{_pct(hit_rate(e, lo, hi))} / {_pct(hit_rate(s, lo, hi))}",
        f"{_pct(hit_rate(e, lo, hi, orig))} / {_pct(hit_rate(s, lo, hi, steady_orig))}",
        f"{_pct(hit_rate(e, elastic.removed_at, end + 1))} / {_pct(hit_rate(s, elastic.removed_at, end + 1))}",
        f"{_pct(elastic.summary.hit_rate)} / {_pct(steady.summary.hit_rate)}",
        str(elastic.summary.errors),
    ]  # fmt: skip


async def run_elastic(config: ElasticConfig, trace: TraceConfig, console: Any, tokenizer_dir: str) -> list[tuple[ElasticRun, ElasticRun]]:
    import tempfile

    from gateway_lab.bench.workloads import Vocab

    workload = load_trace_workload(config.trace, trace, Vocab.from_tokenizer_dir(tokenizer_dir))
    span = max((s.arrival_s or 0.0) for s in workload)
    console.print(f"{workload.name}: {len(workload)} requests over {span:.0f} s; "
                  f"{config.start_workers} -> {config.peak_workers} workers at {config.add_at_s:g} s, "
                  f"-> {config.end_workers} at {config.remove_at_s:g} s")
    pairs = []
    with tempfile.TemporaryDirectory(prefix="token-gateway-elastic-") as scratch:
        for fleet in config.fleets:
            for policy in config.policies:
                runs = []
                for elastic in (True, False):
                    start = time.monotonic()
                    runs.append(await run_one(workload, policy, FLEETS[fleet], config, tokenizer_dir, scratch,
                                              fleet_name=fleet, elastic=elastic))
                    console.print(f"{fleet} {policy} {'elastic' if elastic else 'steady'}: hit "
                                  f"{_pct(runs[-1].summary.hit_rate)}, errors {runs[-1].summary.errors} "
                                  f"({time.monotonic() - start:.0f} s)")
                pairs.append((runs[0], runs[1]))
                console.print(" | ".join(row(runs[0], runs[1], config)))
    return pairs


def run(args: argparse.Namespace) -> int:
    from gateway_lab.bench import results
    from gateway_lab.bench.results import Result, Table, write
    from gateway_lab.bench.workloads import default_tokenizer_dir

    try:
        config = from_namespace(ElasticConfig, args)
    except ValueError as exc:
        raise SystemExit(f"bad arguments: {exc}") from exc
    trace = from_namespace(TraceConfig, args)
    if not config.trace or not Path(config.trace).is_file():
        raise SystemExit("give --trace FILE (a Mooncake trace or JSONL prompts with timestamps)")
    console = results.console(180)
    result = Result()
    pairs = asyncio.run(run_elastic(config, trace, console, str(default_tokenizer_dir())))
    title = f"elastic fleet {config.start_workers} -> {config.peak_workers} -> {config.end_workers}"
    result.tables.append(Table.of(title, HEADER, [row(e, s, config) for e, s in pairs]))
    result.data = {
        "elastic": dataclasses.asdict(config),
        "trace": dataclasses.asdict(trace),
        "runs": [
            {"fleet": r.fleet, "policy": r.policy, "elastic": r.elastic, "added_at": r.added_at,
             "removed_at": r.removed_at, "original": r.original, "added": r.added, "removed": r.removed,
             "summary": r.summary.to_dict()}
            for pair in pairs for r in pair
        ],
    }  # fmt: skip
    for run in (r for pair in pairs for r in pair):
        kind = "elastic" if run.elastic else "steady"
        result.count_failed(f"{run.fleet} {run.policy} {kind}", run.summary.errors, run.summary.requests)
    return write(result, console, json_path=config.json_out, markdown_path=config.markdown)
