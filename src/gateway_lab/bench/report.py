"""Figures of a run, and the side-by-side comparison of runs (one per policy).

The cache hit rate is the workers' own word: the sum of the ``cached_tokens`` they
reported in usage over the sum of prompt tokens. When the simulated fleet's counters
are available, the hit rate they count themselves is shown next to it as a cross-check.
"""

from __future__ import annotations

import math
import statistics
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from gateway_lab.bench.driver import RunResult
from gateway_lab.bench.results import Result, Table

TTFT_QUANTILES = (10, 25, 50, 75, 90, 99)


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-th percentile (0-100), linear between closest ranks; None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


@dataclass(frozen=True, slots=True)
class Spread:
    """How evenly requests landed on workers (CV = population stdev / mean)."""

    per_worker: dict[str, int]
    min: int
    max: int
    cv: float

    @classmethod
    def of(cls, counts: Mapping[str, int]) -> Spread | None:
        if not counts:
            return None
        values = list(counts.values())
        mean = statistics.fmean(values)
        cv = statistics.pstdev(values) / mean if mean else 0.0
        return cls(dict(sorted(counts.items())), min(values), max(values), cv)


@dataclass(frozen=True, slots=True)
class RunSummary:
    label: str
    workload: str
    requests: int
    ok: int
    errors: int
    not_sent: int
    wall_s: float
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    hit_rate: float
    ideal_hit_rate: float | None
    worker_hit_rate: float | None  # from the workers' own counters, when available
    output_tok_s: float
    total_tok_s: float
    req_s: float
    ttft_p50_s: float | None
    ttft_p99_s: float | None
    latency_p50_s: float | None
    latency_p99_s: float | None
    spread: Spread | None
    first_errors: tuple[str, ...] = ()
    ttfts_s: tuple[float, ...] = field(default=(), repr=False)
    # the TTFT distribution (p10 ... p99), to compare policies and gateways beyond two points
    ttft_quantiles_s: dict[str, float | None] = field(default_factory=dict)

    def to_dict(self, *, with_samples: bool = False) -> dict[str, Any]:
        data = asdict(self)
        if not with_samples:
            data.pop("ttfts_s")
        return data


def worker_counts(run: RunResult, worker_ids: Iterable[str] = ()) -> dict[str, int]:
    """Requests per worker: the workers' own counters if known, else ``x-worker-id`` headers.

    ``worker_ids`` lists every worker of the pool so idle ones count as zero.
    """
    counts: Counter[str] = Counter({w: 0 for w in worker_ids})
    if run.worker_counters:
        for worker, counters in run.worker_counters.items():
            counts[worker] += int(counters.get("requests", 0))
    else:
        counts.update(r.worker_id for r in run.results if r.ok and r.worker_id)
    return dict(counts) if any(counts.values()) else {}


def _worker_hit_rate(counters: Mapping[str, Mapping[str, Any]]) -> float | None:
    prompt = sum(int(c.get("prompt_tokens", 0)) for c in counters.values())
    cached = sum(int(c.get("cached_tokens", 0)) for c in counters.values())
    return cached / prompt if prompt else None


def summarize(
    run: RunResult, *, ideal_hit_rate: float | None = None, worker_ids: Iterable[str] = ()
) -> RunSummary:
    ok = [r for r in run.results if r.ok]
    prompt = sum(r.prompt_tokens for r in ok)
    completion = sum(r.completion_tokens for r in ok)
    cached = sum(r.cached_tokens for r in ok)
    wall = run.wall_s if run.wall_s > 0 else float("nan")
    ttfts = [r.ttft_s for r in ok if r.ttft_s is not None]
    latencies = [r.latency_s for r in ok if r.latency_s is not None]
    errors = [r for r in run.results if not r.ok]
    return RunSummary(
        label=run.label,
        workload=run.workload,
        requests=len(run.results),
        ok=len(ok),
        errors=len(errors),
        not_sent=run.not_sent,
        wall_s=run.wall_s,
        prompt_tokens=prompt,
        completion_tokens=completion,
        cached_tokens=cached,
        hit_rate=cached / prompt if prompt else 0.0,
        ideal_hit_rate=ideal_hit_rate,
        worker_hit_rate=_worker_hit_rate(run.worker_counters),
        output_tok_s=completion / wall,
        total_tok_s=(prompt + completion) / wall,
        req_s=len(ok) / wall,
        ttft_p50_s=percentile(ttfts, 50),
        ttft_p99_s=percentile(ttfts, 99),
        ttft_quantiles_s={f"p{q}": percentile(ttfts, q) for q in TTFT_QUANTILES},
        latency_p50_s=percentile(latencies, 50),
        latency_p99_s=percentile(latencies, 99),
        spread=Spread.of(worker_counts(run, worker_ids)),
        first_errors=tuple(dict.fromkeys(str(r.error) for r in errors))[:3],
        ttfts_s=tuple(ttfts),
    )


# ---------------------------------------------------------------------------- rendering


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{1000 * x:,.0f} ms"


def _num(x: float | None) -> str:
    return "-" if x is None or math.isnan(x) else f"{x:,.1f}"


# (row title, value getter, formatter, which is better: +1 higher, -1 lower, 0 neither)
_ROWS: list[tuple[str, Any, Any, int]] = [
    ("cache hit rate", lambda s: s.hit_rate, _pct, +1),
    ("  workers' own count", lambda s: s.worker_hit_rate, _pct, 0),
    ("  ideal (infinite cache)", lambda s: s.ideal_hit_rate, _pct, 0),
    ("output tok/s", lambda s: s.output_tok_s, _num, +1),
    ("total tok/s", lambda s: s.total_tok_s, _num, +1),
    ("req/s", lambda s: s.req_s, lambda x: "-" if x is None else f"{x:.2f}", +1),
    ("TTFT p50", lambda s: s.ttft_p50_s, _ms, -1),
    ("TTFT p99", lambda s: s.ttft_p99_s, _ms, -1),
    ("latency p50", lambda s: s.latency_p50_s, _ms, -1),
    ("latency p99", lambda s: s.latency_p99_s, _ms, -1),
    ("requests ok / sent", lambda s: f"{s.ok} / {s.requests}", str, 0),
    ("errors", lambda s: s.errors, str, 0),
    ("not sent (time limit)", lambda s: s.not_sent, str, 0),
    ("requests per worker min/max", lambda s: s.spread and f"{s.spread.min} / {s.spread.max}", lambda x: x or "-", 0),
    ("  spread (CV)", lambda s: s.spread and s.spread.cv, lambda x: "-" if x is None else f"{x:.2f}", -1),
    ("wall time", lambda s: s.wall_s, lambda x: f"{x:.1f} s", 0),
]


def comparison_table(summaries: Sequence[RunSummary], title: str = "") -> Table:
    """One column per run (policy), one row per figure, the best of each row marked."""
    rows, best = [], set()
    for r, (name, get, fmt, better) in enumerate(_ROWS):
        values = [get(s) for s in summaries]
        numeric = [v for v in values if isinstance(v, int | float) and not math.isnan(v)]
        if better and len(numeric) > 1 and len(set(numeric)) > 1:
            top = max(numeric) if better > 0 else min(numeric)
            best |= {(r, 1 + i) for i, v in enumerate(values) if v == top}
        rows.append([name, *(fmt(v) for v in values)])
    return Table.of(title, ["figure", *(s.label for s in summaries)], rows, labels=1, best=frozenset(best))


def comparison(summaries: Sequence[RunSummary], title: str = "", **data: Any) -> Result:
    """The runs side by side, their errors as notes; JSON ``{"runs": [...], **data}``."""
    notes = [f"{s.label}: {e}" for s in summaries for e in s.first_errors]
    return Result([comparison_table(summaries, title)], notes, {"runs": [s.to_dict() for s in summaries], **data})
