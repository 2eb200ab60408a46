"""The prefill gate's rule: should a request wait for another one's prefill, and for whom.

A worker that schedules first come, first served admits two requests of one group into
the same prefill batch when both are queued before the first has been prefilled: each
computes the shared prefix, because neither finds it cached. The gateway sees the
situation coming: a request it is about to send shares a long prefix with a request it
already sent to that worker which has not produced its first token yet (its prefix is
not cached there yet). Holding the new request until that first token arrives turns a
second full prefill of the prefix into a cache hit. In the simulated gsp burst these
*in-batch duplicates* were a large share of the misses that routing alone could not avoid.

``PrefillGate`` keeps, per worker, the requests in prefill (dispatched, no first token
yet) with their packed prompt and the tokens the policy predicted cached for them at
dispatch. ``blocker`` answers for a new request routed to a worker with a predicted
match: the in-prefill request on that worker whose prefill would give it the most
tokens it does not have yet, when that gain is at least ``min_gain_tokens`` (whole
pages). The *waiting* (events, timeouts, cancellation) is the pipeline's
(``pipeline/prefill_gate.py``); this module is pure and synchronous.
"""

from __future__ import annotations

from dataclasses import dataclass

INDEX_TOKENS = 16  # in-prefill requests are indexed by their first 16 tokens (one block)
DEFAULT_MIN_GAIN_TOKENS = 512


@dataclass(frozen=True, slots=True)
class Prefilling:
    """A request sent to ``worker_id`` that has no first token yet."""

    key: int
    worker_id: str
    prompt: bytes  # packed uint32 token ids
    cached: int  # tokens of it predicted cached on the worker at dispatch


def shared_tokens(a: bytes, b: bytes, limit: int, page: int = 1) -> int:
    """Tokens the packed prompts ``a`` and ``b`` share from the start, at most ``limit``,
    rounded down to whole ``page``-token pages (a binary search of ``memcmp``s)."""
    page = max(1, page)
    hi = min(limit, len(a) >> 2, len(b) >> 2) // page
    if hi <= 0:
        return 0
    if a[: hi * page * 4] == b[: hi * page * 4]:
        return hi * page
    lo = 0  # a[:lo pages] == b[:lo pages]; a[:hi pages] != b[:hi pages]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        n = mid * page * 4
        if a[:n] == b[:n]:
            lo = mid
        else:
            hi = mid
    return lo * page


def slot_free(sent_in_flight: int, max_running_requests: int) -> bool:
    """Whether a request sent now would be admitted at once (a running slot is free, or the
    worker's cap is unknown). Only then is a hold short and safe: the blocker is being
    prefilled right now. On a worker whose slots are all taken the blocker is queued; a
    held request would lose its place in the queue to everything sent meanwhile, and the
    groups released together run back to back, leaving the prefixes of the later ones
    idle long enough to be evicted by a cache that keeps finished requests' output
    (SGLang's): in the simulation that lost hits on the gsp burst instead of gaining
    them. Requests queued behind a busy worker's blocker are admitted
    after it has been prefilled anyway, one slot at a time."""
    return max_running_requests <= 0 or sent_in_flight < max_running_requests


class PrefillGate:
    """Requests in prefill per worker, and the rule for holding a new one behind them."""

    def __init__(self) -> None:
        self._entries: dict[int, Prefilling] = {}
        self._index: dict[tuple[str, bytes], dict[int, Prefilling]] = {}

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: object) -> bool:
        return key in self._entries

    def add(self, key: int, worker_id: str, prompt: bytes, cached: int) -> None:
        """``key`` was sent to ``worker_id`` and will compute ``prompt`` past ``cached`` tokens."""
        if len(prompt) < INDEX_TOKENS * 4:
            return  # too short to share a prefix worth waiting for
        self.remove(key)
        entry = Prefilling(key, worker_id, prompt, cached)
        self._entries[key] = entry
        self._index.setdefault((worker_id, prompt[: INDEX_TOKENS * 4]), {})[key] = entry

    def remove(self, key: int) -> Prefilling | None:
        """``key`` produced its first token, failed or was cancelled: it no longer blocks anyone."""
        entry = self._entries.pop(key, None)
        if entry is not None:
            ik = (entry.worker_id, entry.prompt[: INDEX_TOKENS * 4])
            bucket = self._index.get(ik)
            if bucket is not None:
                bucket.pop(key, None)
                if not bucket:
                    del self._index[ik]
        return entry

    def blocker(
        self, worker_id: str, prompt: bytes, predicted: int, *, min_gain_tokens: int = DEFAULT_MIN_GAIN_TOKENS,
        page: int = 1,
    ) -> tuple[Prefilling, int] | None:
        """(the in-prefill request on ``worker_id`` to wait for, tokens its prefill gains us),
        or None when no wait is worth ``min_gain_tokens``.

        ``predicted`` is the policy's predicted match of ``prompt`` on the worker (the tree
        already counts what in-prefill requests were sent there). A request ``e`` in prefill
        gains us the part of the prefix we share with it beyond what was cached before it
        (``e.cached``): those tokens are being computed now and would be computed twice if
        we were admitted into the same batch.
        """
        if predicted < max(1, min_gain_tokens) or len(prompt) < INDEX_TOKENS * 4:
            return None
        bucket = self._index.get((worker_id, prompt[: INDEX_TOKENS * 4]))
        if not bucket:
            return None
        best: Prefilling | None = None
        best_gain = max(1, min_gain_tokens) - 1
        for e in bucket.values():
            if predicted - e.cached <= best_gain:
                continue  # cannot gain enough whatever it shares
            gain = shared_tokens(prompt, e.prompt, predicted, page) - e.cached
            if gain > best_gain:
                best, best_gain = e, gain
        return None if best is None else (best, best_gain)
