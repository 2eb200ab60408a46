"""Bounded soak: ~2k mixed requests with random worker faults and client hang-ups.

At the end every request succeeded or got a clean error, every in-flight counter
(gateway load guards, HTTP in-flight gauge, simulated workers' queues) is zero,
and resident memory stopped growing after warm-up. ``token-gateway bench soak`` runs the
long version for docs/BENCHMARKS.md.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway_lab.bench.soak import KINDS, SoakConfig, run_soak

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
    # Faults are injected (fault_flips below); since retries, resumes and panic routing
    # absorb them, clients may see no error at all, so a clean error is allowed, not required.
    assert report.outcomes.get("disconnected", 0) > 0, summary
    assert sum(report.fault_flips.values()) >= 3, summary
    assert all(report.by_kind[k].get("ok", 0) > 0 for k in KINDS), report.by_kind
    assert len(report.rss_mb) >= 5
    assert report.growth(report.rss_mb) < RSS_GROWTH_LIMIT_MB, report.rss_mb


@pytest.mark.slow
@pytest.mark.timeout(150)
async def test_soak_with_the_gateway_in_its_own_process(tmp_path: Path) -> None:
    """The gateway runs as `token-gateway serve`: its RSS is sampled alone, its counters read over HTTP."""
    cfg = SoakConfig(
        requests=600, concurrency=16, workers=3, seed=11, max_seconds=60.0, memory_samples=6,
        gateway_process=True, trace_memory=True, heap_top=5,
    )  # fmt: skip
    report = await run_soak(cfg, tmp_path)
    summary = {k: v for k, v in report.to_dict().items() if k != "config"}
    assert report.completed >= 300, summary
    assert report.all_clean, report.unclean_examples
    assert report.idle, report.leftover
    # read from the child's /metrics (the scrape itself not counted): every in-flight gauge is zero
    assert set(report.idle_gauges) >= {"token_gateway_worker_in_flight", "token_gateway_http_requests_in_flight"}, summary
    assert not any(report.idle_gauges.values()), report.idle_gauges
    assert report.rss_of.startswith("gateway process"), report.rss_of
    assert len(report.rss_mb) >= 3 and all(mb > 0 for mb in report.rss_mb), report.rss_mb
    assert len(report.soak_rss_mb) == len(report.rss_mb)
    # the child traced its heap and dumped snapshots on SIGUSR2; the soak diffed the first and last
    assert report.heap_growth and report.heap_growth[0].startswith("traced heap"), report.heap_growth
    assert len(report.heap_traced_mb) == 3, report.heap_traced_mb  # warm-up, mid-run, end
    # With the gateway in its own process, breaker-open 503s come back so fast that they
    # can outnumber the successes in a run this short; successes must still be plenty.
    assert report.outcomes.get("ok", 0) >= report.completed // 6, summary
