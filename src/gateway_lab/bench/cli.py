"""Drive a workload through running gateways and compare them side by side.

    python -m gateway_lab.bench --workload gsp --target round_robin=http://127.0.0.1:8001 \\
                                                    cache_aware=http://127.0.0.1:8002

Each target gets the same seeded workload in turn; the table, ``--json`` and ``--plot``
compare them. ``--save-trace`` writes the generated workload as a replayable JSONL trace.
For a fair comparison give each target its own cold workers: targets that share workers
also share their KV caches, so a later run profits from an earlier one's prefixes.
(The ``demo`` command does all of this against a simulated fleet it starts itself.)
"""

from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gateway.settings import add_options, from_namespace, option
from gateway_lab.bench.driver import DriverConfig
from gateway_lab.bench.traces import TraceConfig
from gateway_lab.bench.workloads import ChatConfig, GspConfig, LongMixConfig

WORKLOADS = ["gsp", "chat", "long-mix", "trace"]


@dataclass(slots=True)
class BenchConfig:
    """What to run and where the figures go."""

    target: list[str] = option([], "LABEL=URL of each gateway to drive, in turn")
    workload: str = option("gsp", "workload to generate (or 'trace' to replay --trace)", choices=WORKLOADS)
    trace: str = option(
        "", "JSONL trace to replay with --workload trace: a saved workload, Mooncake's format (hash_ids) "
        "or prompts with timestamps (scaled by the 'trace scaling' options)"
    )
    trace_times: bool = option(True, "replay a trace at its timestamps (else closed loop)")
    save_trace: str = option("", "write the workload to this JSONL trace before running")
    seed: int = option(0, "workload seed")
    page_size: int = option(16, "KV page size used for the workload's ideal hit rate")
    tokenizer_dir: str = option("", "tokenizer files for prompts (empty: the bundled Qwen3 files)")
    json_out: str = option("", "write the figures as JSON to this file", flag="--json")
    plot: str = option("", "write a comparison PNG to this file")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    for title, cls in (
        ("run", BenchConfig),
        ("load", DriverConfig),
        ("gsp workload", GspConfig),
        ("chat workload", ChatConfig),
        ("long-mix workload", LongMixConfig),
        ("trace scaling (Mooncake and timestamped traces)", TraceConfig),
    ):
        add_options(parser.add_argument_group(title), cls)


def build_workload(config: BenchConfig, args: argparse.Namespace) -> Any:
    """The workload the flags describe (a ``Workload``)."""
    from gateway_lab.bench import workloads as wl

    if config.workload == "trace":
        if not config.trace:
            raise SystemExit("--workload trace needs --trace FILE")
        from gateway_lab.bench.traces import is_foreign_trace, load_trace_workload

        if is_foreign_trace(config.trace):
            scaling = from_namespace(TraceConfig, args)
            if not config.trace_times:
                scaling.time_scale = 0.0
            return load_trace_workload(config.trace, scaling, wl.Vocab.from_tokenizer_dir(config.tokenizer_dir or None))
        return wl.load_trace(config.trace, use_times=config.trace_times)
    vocab = wl.Vocab.from_tokenizer_dir(config.tokenizer_dir or None)
    if config.workload == "gsp":
        return wl.gsp(from_namespace(GspConfig, args), vocab, config.seed)
    if config.workload == "chat":
        return wl.multi_turn_chat(from_namespace(ChatConfig, args), vocab, config.seed)
    return wl.long_context_mix(from_namespace(LongMixConfig, args), vocab, config.seed)


def ideal_for(workload: Any, runs: list[Any], config: BenchConfig) -> float | None:
    """The workload's ideal hit rate; chat prompts are rendered from what the run sent."""
    from gateway_lab.bench import workloads as wl

    if all(s.prompt_token_ids is not None for s in workload):
        return wl.ideal_hit_rate(workload, config.page_size)
    if all(s.endpoint == "chat" for s in workload) and runs:
        # in the order they were sent: a turn's reply is cached before the next turn asks
        sent = sorted((r for r in runs[0].results if r.ok), key=lambda r: r.start_s)
        prompts, afters = wl.render_chat_prompts(
            [r.messages for r in sent], config.tokenizer_dir or None, replies=[r.text for r in sent],
            reply_tokens=[r.completion_tokens for r in sent],
        )
        return wl.ideal_hit_rate(prompts, config.page_size, cached_after=afters)
    if all(s.endpoint == "completions" for s in workload):
        from tokenizers import Tokenizer

        directory = Path(config.tokenizer_dir) if config.tokenizer_dir else wl.default_tokenizer_dir()
        tok = Tokenizer.from_file(str(directory / "tokenizer.json"))
        return wl.ideal_hit_rate(
            workload, config.page_size, tokenize=lambda s: tok.encode(s, add_special_tokens=False).ids
        )
    return None


def run(args: argparse.Namespace) -> int:
    import asyncio

    from rich.console import Console

    from gateway_lab.bench import report
    from gateway_lab.bench.driver import run_workload
    from gateway_lab.bench.machine import facts
    from gateway_lab.bench.results import write
    from gateway_lab.bench.workloads import write_trace

    config = from_namespace(BenchConfig, args)
    driver = from_namespace(DriverConfig, args)
    targets = [t.partition("=") for t in config.target]
    if not targets or any(not url for _, _, url in targets):
        raise SystemExit("give at least one --target LABEL=URL")
    console = Console()
    started = facts()
    workload = build_workload(config, args)
    if config.save_trace:
        write_trace(workload, config.save_trace)
        console.print(f"trace written to {config.save_trace} ({len(workload)} requests)")

    from gateway_lab.bench.progress import BenchProgress

    planned = min(len(workload), driver.max_requests) if driver.max_requests > 0 else len(workload)

    async def drive_all() -> list[Any]:
        runs = []
        with BenchProgress(console) as bars:
            for label, _, url in targets:
                console.print(f"driving {len(workload)} {workload.name} requests through {label} ({url})")
                on_result = bars.run(label, planned)
                runs.append(await run_workload(url, workload, driver, label=label, on_result=on_result))
        return runs

    try:
        runs = asyncio.run(drive_all())
    except KeyboardInterrupt:
        console.print("interrupted")
        return 130
    ideal = ideal_for(workload, runs, config)
    summaries = [report.summarize(r, ideal_hit_rate=ideal) for r in runs]
    params = dict(workload.params) | {"driver": dataclasses.asdict(driver)}
    result = report.comparison(summaries, f"{workload.name}: {len(workload)} requests", workload=params)
    result.machine = started
    for summary in summaries:
        result.count_failed(summary.label, summary.errors, summary.requests)
    status = write(result, console, json_path=config.json_out)
    if config.plot:
        from gateway_lab.bench.plot import plot_comparison

        plot_comparison(summaries, config.plot, title=f"{workload.name} workload")
        console.print(f"plot written to {config.plot}")
    return status
