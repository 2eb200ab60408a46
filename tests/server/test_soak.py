"""Bounded soak: ~2k mixed requests with random worker faults and client hang-ups.

At the end every request succeeded or got a clean error, every in-flight counter
(gateway load guards, HTTP in-flight gauge, simulated workers' queues) is zero,
and resident memory stopped growing after warm-up. ``scripts/soak.py`` runs the
long version for docs/BENCHMARKS.md.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.bench.soak import KINDS, SoakConfig, run_soak

# Generous on purpose: RSS moves in allocator-sized steps; a leak of even a few KB
# per request would add tens of MB over the measured part of the run.
RSS_GROWTH_LIMIT_MB = 24.0


@pytest.mark.slow
@pytest.mark.timeout(150)
async def test_soak_mixed_requests_with_faults_and_disconnects(tmp_path: Path) -> None:
    cfg = SoakConfig(requests=2000, concurrency=32, workers=3, seed=7, max_seconds=80.0)
    report = await run_soak(cfg, tmp_path)
    summary = {k: v for k, v in report.to_dict().items() if k != "config"}
    assert report.completed >= 1000, summary  # bounded in time, but most of it must run
    assert report.all_clean, report.unclean_examples
    assert report.idle, report.leftover
    assert report.outcomes.get("ok", 0) >= report.completed // 2, summary
    assert report.outcomes.get("clean_error", 0) > 0, summary  # the faults did bite
    assert report.outcomes.get("disconnected", 0) > 0, summary
    assert sum(report.fault_flips.values()) >= 3, summary
    assert all(report.by_kind[k].get("ok", 0) > 0 for k in KINDS), report.by_kind
    assert len(report.rss_mb) >= 5
    assert report.growth(report.rss_mb) < RSS_GROWTH_LIMIT_MB, report.rss_mb
