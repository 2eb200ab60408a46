"""One PNG comparing runs: cache hit rate vs the ideal, throughput, and TTFT distributions."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from gateway_lab.bench.report import RunSummary


def plot_comparison(summaries: Sequence[RunSummary], path: str | Path, title: str = "") -> Path:
    """Write a three-panel figure to ``path`` (matplotlib, Agg backend: no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [s.label for s in summaries]
    colors = [plt.get_cmap("tab10")(i % 10) for i in range(len(summaries))]
    x = list(range(len(summaries)))
    fig, (ax_hit, ax_tput, ax_ttft) = plt.subplots(1, 3, figsize=(15, 4.8))

    hits = [100 * s.hit_rate for s in summaries]
    bars = ax_hit.bar(x, hits, color=colors)
    for bar, hit in zip(bars, hits, strict=True):  # inside tall bars: clear of the ideal line
        inside = hit >= 12
        ax_hit.annotate(f"{hit:.1f}%", (bar.get_x() + bar.get_width() / 2, hit),
                        xytext=(0, -14 if inside else 3), textcoords="offset points", ha="center",
                        color="white" if inside else "black", fontweight="bold" if inside else None)
    ideals = [s.ideal_hit_rate for s in summaries if s.ideal_hit_rate is not None]
    if ideals:
        ideal = 100 * max(ideals)
        ax_hit.axhline(ideal, color="black", linestyle="--", linewidth=1,
                       label=f"ideal (infinite shared cache) {ideal:.1f}%")
        ax_hit.legend(loc="upper left", fontsize=9)
    ax_hit.set_ylim(0, 115)
    ax_hit.set_ylabel("prompt tokens served from cache (%)")
    ax_hit.set_title("cache hit rate (higher is better)")

    tput = [s.output_tok_s for s in summaries]
    bars = ax_tput.bar(x, tput, color=colors)
    ax_tput.bar_label(bars, fmt="%.0f", padding=2)
    ax_tput.set_ylim(0, max([*tput, 1.0]) * 1.15)
    ax_tput.set_ylabel("output tokens / s")
    ax_tput.set_title("output throughput (higher is better)")

    for ax in (ax_hit, ax_tput):
        ax.set_xticks(x, labels, rotation=15)
        ax.grid(axis="y", alpha=0.3)

    for s, color in zip(summaries, colors, strict=True):
        samples = sorted(1000 * t for t in s.ttfts_s)
        if samples:
            ys = [(i + 1) / len(samples) for i in range(len(samples))]
            ax_ttft.step(samples, ys, where="post", color=color, label=s.label)
    ax_ttft.set_xlabel("time to first token (ms)")
    ax_ttft.set_ylabel("fraction of requests")
    ax_ttft.set_title("TTFT distribution (CDF; left is better)")
    ax_ttft.set_ylim(0, 1.02)
    ax_ttft.grid(alpha=0.3)
    ax_ttft.legend(loc="lower right")

    if title:
        fig.suptitle(title)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
