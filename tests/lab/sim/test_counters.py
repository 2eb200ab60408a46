"""A simulated worker's totals (gateway_lab/sim/counters.py): the hit rate and the report."""

from __future__ import annotations

from gateway_lab.sim.counters import SimCounters


def test_the_hit_rate_and_the_report() -> None:
    c = SimCounters()
    assert c.cache_hit_rate == 0.0  # nothing admitted yet
    c.prompt_tokens, c.cached_tokens, c.busy_seconds = 300, 100, 1.23456789
    report = c.as_dict()
    assert report["cache_hit_rate"] == round(1 / 3, 6) and report["busy_seconds"] == 1.234568
    assert set(report) >= {"requests", "samples", "finished", "aborted", "generated_tokens", "health_checks"}
