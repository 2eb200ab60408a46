"""`token-gateway demo`: what token-prefix routing is worth, on this machine, in ~2 minutes.

For each policy it starts a *fresh* simulated fleet (so every policy starts with cold,
equal caches) in its own process, starts `token-gateway serve` with that policy, drives
the same seeded shared-prefix (gsp) workload through it with a live progress bar,
collects the figures and the workers' own counters, and stops both. Then it prints the
policies side by side (and optionally writes a plot and JSON).

The fleet's KV capacity is sized so that one worker cannot keep every group's system
prompt, but the fleet together can: a policy that keeps each group on the same worker
gets cache hits, one that sprays requests evicts its own prefixes. Prefill is the
expensive part of a step in the simulation, so hits show up as lower TTFT and more
throughput, not only as a higher hit rate. No GPU, no network: everything is on 127.0.0.1.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gateway.settings import add_options, from_namespace, option
from gateway_lab.bench.workloads import GspConfig

HELP = "run the shared-prefix demo: simulated fleet + gateway + workload, per policy"

if TYPE_CHECKING:
    from gateway_lab.bench.report import RunSummary

# The demo's workload: the reference gsp (64x16, 2048+128 -> 256) scaled down to run in
# about two minutes for three policies on a 2-core machine.
DEMO_GSP = GspConfig(groups=16, prompts_per_group=24, system_tokens=1024, question_tokens=64, output_tokens=32)


@dataclass(slots=True)
class DemoConfig:
    """The fleet, the load, and where the figures go."""

    policies: list[str] = option(
        ["round_robin", "prefix_hash", "cache_aware"],
        "routing policies to compare, in this order (a '+kv' suffix runs that gateway with --kv-events)",
    )
    workers: int = option(8, "simulated workers (all hosted by one sim-worker process)")
    concurrency: int = option(32, "requests in flight at most")
    seed: int = option(0, "workload seed (every policy sees the same requests)")
    kv_capacity_tokens: int = option(
        0, "KV capacity per worker, tokens (0: auto: about twice a worker's share of the "
        "groups' system prompts plus its running requests, never all the groups)"
    )  # fmt: skip
    page_size: int = option(16, "KV page size of the simulated workers, tokens")
    max_running_requests: int = option(16, "max sequences running at once per worker")
    # A big model on a modest GPU: an uncached 1088-token prompt takes ~0.45 s to prefill, a
    # cached one ~0.05 s. Slow enough that the gateway's own CPU use on a 2-core machine
    # stays well below what the simulated GPUs allow, so the figures are the policies'.
    step_base_s: float = option(0.02, "simulated cost of one scheduler step, s")
    prefill_token_s: float = option(0.0004, "simulated cost per uncached prompt token, s")
    decode_seq_s: float = option(0.002, "simulated cost per decoding sequence per step, s")
    time_scale: float = option(1.0, "wall seconds per simulated second")
    run_timeout_s: float = option(240.0, "wall-time limit of one policy's run, s")
    request_timeout_s: float = option(60.0, "give up on one request after this many s")
    ready_timeout_s: float = option(60.0, "how long the fleet and the gateway may take to start, s")
    serve_flags: str = option(
        "", "extra `serve` flags for every gateway, one shell-quoted string (e.g. --serve-flags='--tree-budget-fraction 2')"
    )
    plot: str = option("", "write a comparison PNG to this file")
    json_out: str = option("", "write the figures as JSON to this file", flag="--json")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_options(parser.add_argument_group("demo"), DemoConfig)
    add_options(parser.add_argument_group("gsp workload (G groups x P prompts)"), GspConfig)
    parser.set_defaults(**dataclasses.asdict(DEMO_GSP))


def auto_kv_capacity(config: DemoConfig, gsp: GspConfig) -> int:
    """Per-worker KV tokens: ~2x a worker's share of all system prompts + its running set.

    Always less than all the groups' system prompts (so one worker cannot hold them all)
    while the fleet together holds them twice over.
    """
    per_request = gsp.system_tokens + gsp.question_tokens + gsp.output_tokens
    running = min(config.max_running_requests, math.ceil(config.concurrency / config.workers))
    share = 2 * gsp.groups * gsp.system_tokens / config.workers
    capacity = max(share, (running + 1) * per_request)
    capacity = min(capacity, max(per_request, gsp.groups * gsp.system_tokens - config.page_size))
    return int(math.ceil(capacity / config.page_size) * config.page_size)


def sim_options(config: DemoConfig, gsp: GspConfig) -> dict[str, Any]:
    """SimConfig fields the demo sets (everything else keeps the sim's defaults)."""
    return {
        "page_size": config.page_size,
        "kv_capacity_tokens": config.kv_capacity_tokens or auto_kv_capacity(config, gsp),
        "max_running_requests": config.max_running_requests,
        "step_base_s": config.step_base_s,
        "prefill_token_s": config.prefill_token_s,
        "decode_seq_s": config.decode_seq_s,
        "time_scale": config.time_scale,
        "seed": 0,
    }


async def run_demo(config: DemoConfig, gsp_config: GspConfig, console: Any) -> list[RunSummary]:
    """Run every policy in turn on a fresh fleet; return their summaries."""
    import shlex
    import tempfile

    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from gateway_lab.bench import workloads
    from gateway_lab.bench.driver import DriverConfig
    from gateway_lab.sim.config import SimConfig

    workload = workloads.gsp(gsp_config, workloads.Vocab.from_tokenizer_dir(), config.seed)
    ideal = workloads.ideal_hit_rate(workload, config.page_size)
    sim_config = SimConfig(**sim_options(config, gsp_config))
    driver = DriverConfig(
        concurrency=config.concurrency,
        duration_s=config.run_timeout_s,
        request_timeout_s=config.request_timeout_s,
    )
    console.print(_setup_text(config, gsp_config, sim_config, len(workload), ideal))
    columns = (
        TextColumn("{task.description:<24}"), BarColumn(), MofNCompleteColumn(),
        TextColumn("hit {task.fields[hit]:>6}  errors {task.fields[errors]}"), TimeElapsedColumn(),
    )  # fmt: skip
    summaries = []
    # The gateway fetches its tokenizer from the workers (GetTokenizer) into a scratch cache.
    with tempfile.TemporaryDirectory(prefix="token-gateway-demo-") as scratch, Progress(*columns, console=console) as progress:
        gateway_args = ["--tokenizer-cache-dir", scratch, "--log-level", "warning", *shlex.split(config.serve_flags)]
        for policy in config.policies:
            task = progress.add_task(policy, total=len(workload), hit="-", errors=0, start=False)
            run = await _run_policy(policy, workload, config, sim_config, driver, gateway_args, progress, task)
            progress.stop_task(task)
            summaries.append(summarize_run(run, ideal))
    return summaries


def summarize_run(run: Any, ideal: float) -> RunSummary:
    from gateway_lab.bench.report import summarize

    return summarize(run, ideal_hit_rate=ideal, worker_ids=run.worker_counters)


async def _run_policy(
    policy: str,
    workload: Any,
    config: DemoConfig,
    sim_config: Any,
    driver: Any,
    gateway_args: list[str],
    progress: Any,
    task: Any,
) -> Any:
    """A fresh fleet, a gateway with ``policy``, one workload run; everything stopped after."""
    from gateway_lab.bench import launch
    from gateway_lab.bench.driver import RequestResult, run_workload

    tally = {"prompt": 0, "cached": 0, "errors": 0}

    def on_result(result: RequestResult) -> None:
        if result.ok:
            tally["prompt"] += result.prompt_tokens
            tally["cached"] += result.cached_tokens
        else:
            tally["errors"] += 1
        hit = f"{100 * tally['cached'] / tally['prompt']:.1f}%" if tally["prompt"] else "-"
        progress.update(task, advance=1, hit=hit, errors=tally["errors"])

    progress.update(task, description=f"{policy} (starting)")
    name, variant_args = policy_variant(policy)
    async with launch.fleet("process", config.workers, sim_config, ready_timeout=config.ready_timeout_s) as fleet:
        async with launch.gateway(
            "ours", fleet.urls, name, extra_args=[*gateway_args, *variant_args], ready_timeout_s=config.ready_timeout_s
        ) as gateway:
            progress.update(task, description=policy)
            progress.start_task(task)
            run = await run_workload(gateway.url, workload, driver, label=policy, on_result=on_result)
    run.worker_counters = {str(w["url"]): w for w in (fleet.counters or {}).get("workers", [])}
    return run


# Demo policy suffixes and the `serve` flags they add (compare variants side by side).
VARIANTS: dict[str, list[str]] = {"kv": ["--kv-events"]}


def policy_variant(spec: str) -> tuple[str, list[str]]:
    """``"cache_aware+kv"`` -> (``"cache_aware"``, ``["--kv-events"]``); ValueError if unknown."""
    name, plus, variant = spec.partition("+")
    if plus and variant not in VARIANTS:
        raise ValueError(f"unknown policy variant {variant!r} in {spec!r} (known: {', '.join(VARIANTS)})")
    return name, VARIANTS[variant] if plus else []


def _setup_text(config: DemoConfig, gsp: GspConfig, sim: Any, requests: int, ideal: float) -> str:
    prefill = gsp.system_tokens + gsp.question_tokens
    return (
        f"[bold]gsp workload[/]: {gsp.groups} groups x {gsp.prompts_per_group} prompts = {requests} "
        f"requests; prompt {gsp.system_tokens} shared + {gsp.question_tokens} unique tokens, "
        f"{gsp.output_tokens} output tokens; ideal hit rate {100 * ideal:.1f}%\n"
        f"[bold]fleet[/]: {config.workers} simulated workers, KV {sim.kv_capacity_tokens} tokens each "
        f"(all system prompts: {gsp.groups * gsp.system_tokens}), page {sim.page_size}; "
        f"step {1000 * sim.step_base_s:g} ms + {1e6 * sim.prefill_token_s:g} us/prefill token "
        f"+ {1000 * sim.decode_seq_s:g} ms/decoding seq (an uncached prompt: "
        f"{1000 * sim.prefill_token_s * prefill:.0f} ms), time scale {sim.time_scale:g}\n"
        f"[bold]load[/]: {config.concurrency} requests in flight, policies: {', '.join(config.policies)}"
        + (f"\n[bold]gateway flags[/]: {config.serve_flags}" if config.serve_flags else "")
    )


def _verdict(summaries: list[RunSummary]) -> str:
    """One line comparing the best policy with the first (the baseline)."""
    if len(summaries) < 2:
        return ""
    base = summaries[0]
    best = max(summaries[1:], key=lambda s: s.output_tok_s)
    parts = [f"{best.label} vs {base.label}: hit rate {100 * best.hit_rate:.0f}% vs {100 * base.hit_rate:.0f}%"]
    if base.output_tok_s and best.output_tok_s:
        parts.append(f"throughput x{best.output_tok_s / base.output_tok_s:.2f}")
    if base.ttft_p50_s and best.ttft_p50_s:
        parts.append(f"TTFT p50 x{best.ttft_p50_s / base.ttft_p50_s:.2f}")
    return ", ".join(parts)


def run(args: argparse.Namespace) -> int:
    import asyncio
    import signal

    from rich.console import Console

    from gateway_lab.bench import report
    from gateway_lab.bench.machine import facts
    from gateway_lab.bench.results import write

    config = from_namespace(DemoConfig, args)
    gsp_config = from_namespace(GspConfig, args)
    from gateway.policies.factory import POLICY_NAMES

    unknown = [p for p in config.policies if p.partition("+")[0] not in POLICY_NAMES or p.partition("+")[2] not in ("", *VARIANTS)]
    if unknown or not config.policies:
        raise SystemExit(f"unknown policies {unknown}; choose from {', '.join(POLICY_NAMES)}")
    console = Console()
    started = facts()
    interrupted: list[int] = []

    async def main() -> list[RunSummary]:
        # Ctrl-C and SIGTERM cancel the run, so the finally blocks stop the fleet and the
        # gateway. The cancel is repeated every 2 s until the run has unwound, so a swallowed
        # cancel cannot let the demo carry on (what cleanup it cuts short, atexit finishes).
        loop = asyncio.get_running_loop()
        task = asyncio.current_task()
        assert task is not None

        def interrupt(signum: int) -> None:
            interrupted.append(signum)
            if not task.done():
                task.cancel()
                loop.call_later(2.0, lambda: None if task.done() else interrupt(signum))

        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, interrupt, sig)
        return await run_demo(config, gsp_config, console)

    try:
        summaries = asyncio.run(main())
    except (KeyboardInterrupt, asyncio.CancelledError, RuntimeError) as exc:
        if not interrupted and isinstance(exc, RuntimeError):  # a child that would not start: its log tail is in the message
            console.print(f"[red]demo failed: {exc}[/]")
            return 1
        console.print("[yellow]interrupted: every process the demo started has been stopped[/]")
        return 130
    extra = {"workload": dataclasses.asdict(gsp_config), "demo": dataclasses.asdict(config)}
    result = report.comparison(summaries, "token-gateway demo: policies side by side", **extra)
    result.machine = started
    verdict = _verdict(summaries)
    if verdict:
        result.notes.append(verdict)
    for summary in summaries:  # the bench's one rule for an invalid run
        result.count_failed(summary.label, summary.errors, summary.requests)
        result.require(summary.not_sent == 0, f"{summary.label}: {summary.not_sent} of {summary.requests} requests not sent")
    status = write(result, console, json_path=config.json_out)
    if config.plot:
        from gateway_lab.bench.plot import plot_comparison

        title = (
            f"gsp G={gsp_config.groups} P={gsp_config.prompts_per_group} S={gsp_config.system_tokens} "
            f"Q={gsp_config.question_tokens} O={gsp_config.output_tokens}, {config.workers} simulated workers"
        )
        plot_comparison(summaries, config.plot, title=title)
        console.print(f"plot written to {config.plot}")
    return status
