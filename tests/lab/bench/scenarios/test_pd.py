"""`token-gateway bench pd` (gateway_lab.bench.scenarios.pd): its flags with the demo's
workload defaults, the demo-like sizing of the prefill pool, and the results table."""

from __future__ import annotations

import argparse

from rich.console import Console

from gateway.settings import from_namespace
from gateway_lab.bench.report import RunSummary
from gateway_lab.bench.results import rich_table
from gateway_lab.bench.scenarios import pd as scenario


def _summary(label: str) -> RunSummary:
    return RunSummary(
        label=label, workload="gsp", requests=10, ok=9, errors=1, not_sent=0, wall_s=2.0, prompt_tokens=1000,
        completion_tokens=100, cached_tokens=500, hit_rate=0.5, ideal_hit_rate=0.8, worker_hit_rate=None,
        output_tok_s=50.0, total_tok_s=550.0, req_s=5.0, ttft_p50_s=0.1, ttft_p99_s=0.4, latency_p50_s=None,
        latency_p99_s=None, spread=None,
    )


def test_flags_default_to_the_demos_workload_and_size_the_prefill_pool() -> None:
    parser = argparse.ArgumentParser()
    scenario.add_arguments(parser)
    args = parser.parse_args(["--prefill-policies", "cache_aware", "--prefill-workers", "2"])
    config = from_namespace(scenario.PdBenchConfig, args)
    assert config.prefill_policies == ["cache_aware"] and config.decode_policy == "power_of_two"
    demo = scenario._demo_like(config)
    assert demo.workers == 2 and demo.concurrency == config.concurrency


def test_the_table_shows_the_prefill_sides_own_hit_rate() -> None:
    sides = {"prefill_cached_tokens": 300, "prefill_prompt_tokens": 400, "prefill_requests": [5, 5],
             "rendezvous_ok": 10, "rendezvous_failed": 0}
    console = Console(width=220, record=True)
    console.print(rich_table(scenario.table([(_summary("cache_aware"), sides), (_summary("round_robin"), {**sides, "prefill_prompt_tokens": 0})])))
    text = console.export_text()
    assert "cache_aware" in text and "75.0%" in text and "9/1" in text and "5/5" in text and "10 ok, 0 failed" in text
    assert "0.0%" in text  # no prefill tokens counted: a 0 rate, not a division by zero
