"""Prefill/decode disaggregation on the gsp workload: prefill-side hit rate per prefill policy.

For each prefill policy it starts a *fresh* fleet of simulated workers (4 prefill + 4
decode by default, one ``sim-worker`` process, every cache cold), starts
``token-gateway serve --prefill ... --decode ...`` with that prefill policy (decode
policy fixed, ``power_of_two`` by default), drives the same seeded gsp workload
through it, and reports the prefill workers' own cache hit rate, the decode side's
rendezvous count, throughput and TTFT. The workload, KV sizing and step costs are
the demo's (``gateway_lab.demo``), so the figures compare with the demo's regular fleet.

    token-gateway bench pd                   # about 3 minutes on 2 cores
    token-gateway bench pd --prefill-policies cache_aware --groups 8
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import tempfile
import time
from dataclasses import dataclass
from typing import Any

from rich.console import Console

from gateway.settings import add_options, from_namespace, option
from gateway_lab.bench import launch, workloads
from gateway_lab.bench.driver import DriverConfig, RunResult, run_workload
from gateway_lab.bench.report import RunSummary, summarize
from gateway_lab.bench.results import Result, Table, write
from gateway_lab.bench.workloads import GspConfig
from gateway_lab.demo import DEMO_GSP, DemoConfig, sim_options
from gateway_lab.sim.config import SimConfig


@dataclass
class PdBenchConfig:
    prefill_policies: list[str] = option(["round_robin", "prefix_hash", "cache_aware"], "prefill policies to compare")
    decode_policy: str = option("power_of_two", "decode pool policy (the same for every run)")
    prefill_workers: int = option(4, "simulated prefill workers")
    decode_workers: int = option(4, "simulated decode workers")
    concurrency: int = option(32, "requests in flight at most")
    seed: int = option(0, "workload seed")
    run_timeout_s: float = option(240.0, "wall-time limit of one run, s")
    json_out: str = option("", "write the figures as JSON to this file", flag="--json")


def _demo_like(config: PdBenchConfig) -> DemoConfig:
    """The demo's sim settings, sized for the prefill pool (where prefixes are cached)."""
    return DemoConfig(workers=config.prefill_workers, concurrency=config.concurrency)


async def run_one(
    policy: str, config: PdBenchConfig, sim: SimConfig, workload: Any, scratch: str
) -> tuple[RunResult, dict[str, Any]]:
    roles = ["prefill"] * config.prefill_workers + ["decode"] * config.decode_workers
    driver = DriverConfig(concurrency=config.concurrency, duration_s=config.run_timeout_s, request_timeout_s=60.0)
    async with launch.fleet("process", len(roles), sim, roles=roles, ready_timeout=60.0) as fleet:
        prefill, decode = fleet.urls[: config.prefill_workers], fleet.urls[config.prefill_workers :]
        args = [
            "--prefill", *prefill, "--decode", *decode, "--prefill-policy", policy,
            "--decode-policy", config.decode_policy, "--tokenizer-cache-dir", scratch, "--log-level", "warning",
        ]  # fmt: skip
        async with launch.gateway("ours", [], "", extra_args=args) as gateway:
            run = await run_workload(gateway.url, workload, driver, label=policy)
    counters = {str(w["url"]): w for w in (fleet.counters or {}).get("workers", [])}
    run.worker_counters = {u: c for u, c in counters.items() if c.get("role") == "prefill"}
    pre = list(run.worker_counters.values())
    dec = [c for c in counters.values() if c.get("role") == "decode"]
    sides = {
        "prefill_prompt_tokens": sum(int(c["prompt_tokens"]) for c in pre),
        "prefill_cached_tokens": sum(int(c["cached_tokens"]) for c in pre),
        "prefill_requests": [int(c["requests"]) for c in pre],
        "decode_requests": [int(c["requests"]) for c in dec],
        "rendezvous_ok": sum(int(c["pd_rendezvous_ok"]) for c in dec),
        "rendezvous_failed": sum(int(c["pd_rendezvous_failed"]) for c in dec),
    }
    return run, sides


async def main_async(config: PdBenchConfig, gsp: GspConfig, console: Console) -> list[tuple[RunSummary, dict[str, Any]]]:
    demo = _demo_like(config)
    sim = SimConfig(**sim_options(demo, gsp))
    workload = workloads.gsp(gsp, workloads.Vocab.from_tokenizer_dir(), config.seed)
    ideal = workloads.ideal_hit_rate(workload, sim.page_size)
    console.print(
        f"gsp {gsp.groups}x{gsp.prompts_per_group} = {len(workload)} requests ({gsp.system_tokens}+"
        f"{gsp.question_tokens} -> {gsp.output_tokens} tokens), ideal hit {100 * ideal:.1f}%; "
        f"{config.prefill_workers} prefill + {config.decode_workers} decode sim workers, KV "
        f"{sim.kv_capacity_tokens} tokens each; decode policy {config.decode_policy}"
    )
    out = []
    with tempfile.TemporaryDirectory(prefix="bench-pd-") as scratch:
        for policy in config.prefill_policies:
            started = time.monotonic()
            run, sides = await run_one(policy, config, sim, workload, scratch)
            summary = summarize(run, ideal_hit_rate=ideal, worker_ids=run.worker_counters)
            console.print(f"  {policy}: {summary.ok}/{summary.requests} ok in {time.monotonic() - started:.0f} s")
            out.append((summary, sides))
    return out


def table(results: list[tuple[RunSummary, dict[str, Any]]]) -> Table:
    rows = []
    for s, sides in results:
        hit = sides["prefill_cached_tokens"] / sides["prefill_prompt_tokens"] if sides["prefill_prompt_tokens"] else 0
        rows.append([
            s.label, f"{s.ok}/{s.errors}", f"{100 * hit:.1f}%", f"{100 * s.hit_rate:.1f}%",
            f"{100 * (s.ideal_hit_rate or 0):.1f}%", f"{s.output_tok_s:.0f}", f"{s.req_s:.2f}",
            f"{1000 * (s.ttft_p50_s or 0):.0f} ms", f"{1000 * (s.ttft_p99_s or 0):.0f} ms",
            "/".join(map(str, sides["prefill_requests"])),
            f"{sides['rendezvous_ok']} ok, {sides['rendezvous_failed']} failed",
        ])  # fmt: skip
    header = ["prefill policy", "ok/err", "prefill hit", "client hit", "ideal", "out tok/s", "req/s",
              "TTFT p50", "TTFT p99", "prefill reqs", "rendezvous"]  # fmt: skip
    return Table.of("PD: prefill policy on gsp (4 prefill + 4 decode)", header, rows, labels=0)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The scenario's flags (``token-gateway bench NAME --help``)."""
    add_options(parser.add_argument_group("bench"), PdBenchConfig)
    add_options(parser.add_argument_group("gsp workload"), GspConfig)
    parser.set_defaults(**dataclasses.asdict(DEMO_GSP))


def main(args: argparse.Namespace) -> int:
    """Run the scenario with parsed flags; the exit status."""
    config = from_namespace(PdBenchConfig, args)
    gsp = from_namespace(GspConfig, args)
    console = Console(width=200)
    result = Result()
    results = asyncio.run(main_async(config, gsp, console))
    result.tables.append(table(results))
    result.data = {"runs": [s.to_dict() | {"pd": sides} for s, sides in results]}
    for summary, _ in results:
        result.count_failed(summary.label, summary.errors, summary.requests)
    return write(result, console, json_path=config.json_out)
