"""The comparison figure (gateway_lab/bench/plot.py): one PNG of hit rate against the
ideal, throughput and the TTFT distributions of the runs compared."""

from __future__ import annotations

from pathlib import Path

from gateway_lab.bench.plot import plot_comparison
from gateway_lab.bench.report import RunSummary


def _summary(label: str, hit: float, ttfts: tuple[float, ...]) -> RunSummary:
    return RunSummary(
        label=label, workload="w", requests=10, ok=10, errors=0, not_sent=0, wall_s=1.0, prompt_tokens=1000,
        completion_tokens=100, cached_tokens=int(1000 * hit), hit_rate=hit, ideal_hit_rate=0.8, worker_hit_rate=None,
        output_tok_s=100.0, total_tok_s=1100.0, req_s=10.0, ttft_p50_s=None, ttft_p99_s=None, latency_p50_s=None,
        latency_p99_s=None, spread=None, ttfts_s=ttfts,
    )


def test_a_png_is_written_for_the_runs(tmp_path: Path) -> None:
    out = plot_comparison([_summary("round_robin", 0.05, (0.1, 0.2)), _summary("cache_aware", 0.7, (0.05,)),
                           _summary("empty", 0.0, ())], tmp_path / "cmp.png", title="policies")
    assert out == tmp_path / "cmp.png"
    data = out.read_bytes()
    assert data.startswith(b"\x89PNG\r\n\x1a\n") and len(data) > 10_000
