"""Why a shared-prefix run missed: each shared-prefix miss of a finished run, classified.

A router in front of several gateway replicas can lose hits two ways a single process
cannot: inside the sync lag both replicas see a prefix as cold and each places it on a
worker of its own (a *blind split*), or they weigh load differently and spill it apart.
To tell these from the misses one process has too (a deliberate spill, eviction, two
requests of a group prefilled in one batch), this module replays a run's results in
start order, per shared-prefix group, and classifies every request that missed the
group's shared prefix:

* ``first``: the group's first request (no router avoids it);
* ``blind_new_holder``: sent to a worker that had not been sent the group, by a replica
  that could not know any holder: it had placed none itself and the other replicas'
  placements of the group started less than ``lag_s`` before (not yet heard);
* ``informed_new_holder``: a new holder chosen although a holder was known (a load spill
  or a hot-prefix replica: one process does this too);
* ``duplicate``: the worker had been sent the group, but none of those requests had its
  first token yet (both prefilled the prefix in one batch: the prefill gate's case);
* ``evicted``: the worker had been sent the group and produced a first token for it, yet
  missed: its cache evicted the prefix (or the tree mispredicted).

Request ``i`` of the workload is taken as sent by replica ``i % replicas`` (the benchmark
client's rule). Pure over ``RequestResult``s; the benchmarks print it beside hit rates.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from gateway_lab.bench.driver import RequestResult

KINDS = ("first", "blind_new_holder", "informed_new_holder", "duplicate", "evicted")


@dataclass(slots=True)
class MissBreakdown:
    """Shared-prefix misses by kind (requests and prompt tokens missed), and holders per group."""

    requests: dict[str, int] = field(default_factory=lambda: dict.fromkeys(KINDS, 0))
    tokens: dict[str, int] = field(default_factory=lambda: dict.fromkeys(KINDS, 0))
    holders: list[int] = field(default_factory=list)  # distinct workers each group was sent to

    def as_dict(self) -> dict[str, object]:
        n = len(self.holders)
        return {
            "misses": dict(self.requests),
            "missed_tokens": dict(self.tokens),
            "holders_mean": round(sum(self.holders) / n, 3) if n else 0.0,
            "holders_max": max(self.holders, default=0),
        }

    def row(self) -> str:
        """``first / blind / informed / duplicate / evicted`` request counts."""
        return " / ".join(str(self.requests[k]) for k in KINDS)


def classify_misses(
    results: Iterable[RequestResult], *, shared_tokens: int, replicas: int = 1, lag_s: float = 0.05
) -> MissBreakdown:
    """Classify every ok request whose ``cached_tokens`` fall short of its group's shared
    prefix (``shared_tokens``, less one 64-token margin for page rounding) (see the module
    docstring). Requests without a group or a worker id are skipped."""
    out = MissBreakdown()
    by_group: dict[str, list[RequestResult]] = {}
    for r in results:
        if r.ok and r.group and r.worker_id:
            by_group.setdefault(r.group, []).append(r)
    need = max(1, shared_tokens - 64)
    replicas = max(1, replicas)
    for rs in by_group.values():
        rs.sort(key=lambda r: (r.start_s, r.index))
        # worker -> (replica, start, first-token time) of every earlier request of the group sent there
        sent: dict[str, list[tuple[int, float, float]]] = {}
        for i, r in enumerate(rs):
            rep = r.index % replicas
            wid = r.worker_id or ""
            missed = r.cached_tokens < need
            if missed:
                kind = _kind(i, rep, r.start_s, sent, wid, lag_s)
                out.requests[kind] += 1
                out.tokens[kind] += max(0, r.prompt_tokens - r.cached_tokens)
            first_token = r.start_s + (r.ttft_s if r.ttft_s is not None else 0.0)
            sent.setdefault(wid, []).append((rep, r.start_s, first_token))
        out.holders.append(len(sent))
    return out


def _kind(i: int, rep: int, start: float, sent: dict[str, list[tuple[int, float, float]]], wid: str, lag_s: float) -> str:
    if i == 0:
        return "first"
    here = sent.get(wid)
    if here:
        return "duplicate" if all(ft > start for _, _, ft in here) else "evicted"
    known = any(r == rep or s <= start - lag_s for entries in sent.values() for r, s, _ in entries)
    return "informed_new_holder" if known else "blind_new_holder"
