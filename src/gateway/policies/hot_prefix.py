"""Hot prefixes: which shared prefixes carry more load than one worker can serve, and who holds them.

``cache_aware`` spills a popular prefix when the prefill it saves is smaller than the
work queued behind it, and the spill goes to whichever worker is cheapest at that
moment. Under a skewed load that scatters the prefix over the whole pool one spill at
a time, and every new holder evicts other prefixes to make room. This module gives the
policy the two facts it needs to replicate a hot prefix deliberately instead:

* the prefix's *load share*: requests are keyed by the chained hash of their first
  ``depth_tokens`` (``hashing.prefix_key``), and each key keeps an exponentially decayed
  request count over the last ``window`` requests (logical time, one tick per
  dispatch, so the figure is the same at any request rate). ``share = count / total``.
* its *replica set*: an ordered list of the workers chosen to hold it.

In a pool of ``n`` workers each worker serves about ``1/n`` of the traffic, so a prefix
with ``share * n > 1.25`` is hot and gets ``k = ceil(share * n - 1/4 + h)`` holders (a
quarter-worker of slack so ``k`` does not flap with the noise of the estimate, and
``h``, up to half a worker of headroom for the other prefixes its holders serve). The
headroom is in proportion to the traffic that is *not* on hot prefixes (``cold_share``):
when every offered prefix is hot (8 system prompts on 16 workers) there is no other
traffic to make room for, and a third holder per prefix only recomputes a 2K-token
prompt once more and packs 24 replicas onto 16 workers (``token-gateway bench
policies``). The policy spreads its
requests among the first ``k`` holders only; while fewer than ``k`` hold it, the
cheapest non-holder gets the request and joins the set (one deliberate miss per
replica, instead of whichever worker a spill happens to land on). Shares count only once
``min(64, window / 2)`` (decayed) requests have been seen. The hottest prefix's load
(``top_load``, which sets the policy's weight of queued prefill) reads its count by the
lower confidence bound ``count - NOISE_Z * sqrt(count)`` (the count is about Poisson):
with as many equally popular prefixes as workers each carries exactly a worker's share,
and the luckiest of them reads half again as much for the first hundred requests; taken
at face value that made a uniform burst look hot and spilled its groups to new holders
(16 groups on 16 workers, ``token-gateway bench peer-cost``, where one holder per group
is the ideal). A replica set is sized by the plain share, so a prefix that is hot gets
its holders at once; ``cache_aware`` adds a holder when the prefix is hot beyond luck
(``surely_hot``) or when its cost says the current holders are busier than the rest.
Bounded: at most ``max_tracked`` keys (the coldest are dropped). Pure and synchronous.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

DEFAULT_DEPTH_TOKENS = 256
DEFAULT_WINDOW = 256
DEFAULT_MAX_TRACKED = 4096
SLACK = 0.25  # of a worker's share: a prefix is hot above (1 + SLACK) / n of the traffic
HEADROOM = 0.5  # of a worker: holders keep room for the other traffic they carry
TOP_MIN_REQUESTS = 16  # before these, the hottest prefix's share is not estimated
MIN_REQUESTS = 64  # (decayed) requests before any prefix gets replicas (at most half the window)
NOISE_Z = 2.0  # a count is read as count - NOISE_Z * sqrt(count): sampling luck makes no prefix hot


def sure_count(count: float) -> float:
    """The part of a (decayed) request count that is not sampling luck: its lower confidence
    bound under a Poisson count, ``count - NOISE_Z * sqrt(count)`` (0 at most 4 requests)."""
    return max(0.0, count - NOISE_Z * math.sqrt(count)) if count > 0 else 0.0


class _Entry:
    __slots__ = ("count", "holders", "hot", "tick")

    def __init__(self, tick: int) -> None:
        self.count = 0.0
        self.tick = tick
        self.hot = False  # counted in ``_hot_mass`` (hot when last observed)
        self.holders: list[str] = []


class HotPrefixes:
    """Decayed per-prefix request counts and each hot prefix's ordered holders."""

    def __init__(self, *, window: int = DEFAULT_WINDOW, max_tracked: int = DEFAULT_MAX_TRACKED) -> None:
        if window < 1:
            raise ValueError("hot-prefix window must be >= 1 request")
        self.window = window
        self.max_tracked = max(16, max_tracked)
        self._decay = 1.0 - 1.0 / window
        self._min_total = min(float(MIN_REQUESTS), window / 2)
        self._tick = 0
        self._seen = 0  # requests observed, with a key or not
        self._total = 0.0  # decayed count of all requests
        self._hot_mass = 0.0  # decayed count of the requests of keys hot when last observed
        self._entries: dict[int, _Entry] = {}
        self._top: _Entry | None = None  # the entry with the largest count (exact: decay is uniform)

    def _value(self, e: _Entry) -> float:
        if e.tick != self._tick:
            e.count *= self._decay ** (self._tick - e.tick)
            e.tick = self._tick
        return e.count

    def share(self, key: int) -> float:
        """The decayed share of recent requests that carried ``key`` (0 when unknown)."""
        e = self._entries.get(key)
        if e is None or self._total <= 0:
            return 0.0
        return min(1.0, self._value(e) / self._total)

    def surely_hot(self, key: int, n_workers: int) -> bool:
        """Whether ``key`` carries more than ``1 + SLACK`` workers' worth even with its count
        read by its lower confidence bound (``sure_count``): hot beyond sampling luck."""
        e = self._entries.get(key)
        if e is None or self._total <= 0:
            return False
        return sure_count(self._value(e)) / self._total * n_workers > 1 + SLACK

    def top_load(self, n_workers: int) -> float | None:
        """The hottest prefix's load in workers' fair shares (``share * n``), or None before
        ``TOP_MIN_REQUESTS`` requests with a key, or ``MIN_REQUESTS`` of any kind, have been
        seen; 0 when none of those had a key. O(1).

        Requests without a key count here, as evidence that the traffic is spread: a trace
        of mostly unrelated long prompts (documents asked about once or twice, few shared
        prefixes) otherwise took hundreds of requests to reach ``TOP_MIN_REQUESTS`` keyed
        ones, and the policy held the full queue weight all that time, spilling the repeats
        it could have kept (Mooncake's synthetic trace in ``token-gateway bench policies
        sim``). They need the larger count: in the first moments of a burst of a few hot
        prefixes (gsp) most requests are each group's first, keyless, and reading 16 of them
        as spread traffic piled groups onto their first holders.

        The share is ``sure_count(count) / total``: the largest of many sample counts
        overstates the true largest share (16 requests of 64 equally popular prefixes have a
        top count of 2 or 3 while each is 1/64 of the traffic; 40 requests of 16 prefixes on
        16 workers, a top count of 5 or 6, which reads as two workers' worth while each is
        one), so uniform traffic reads as spread, while a prefix carrying half the requests
        reads as hot within about 20 of them."""
        if self._tick < TOP_MIN_REQUESTS and self._seen < MIN_REQUESTS:
            return None
        top = self._top
        if top is None:
            return 0.0  # requests seen, none sharing a keyed prefix: spread traffic
        return min(1.0, sure_count(self._value(top)) / self._total) * n_workers

    def cold_share(self) -> float:
        """The share of recent requests whose prefix is not hot (1.0 before any is).

        O(1): every count decays by the same factor, so the sum of the counts of the keys
        flagged hot decays by it too; a key's flag is refreshed when it is observed (a key
        that cooled while unobserved keeps its decaying count in the sum until then)."""
        if self._total <= 0:
            return 1.0
        return min(1.0, max(0.0, 1.0 - self._hot_mass / self._total))

    def replicas(self, key: int, n_workers: int) -> int:
        """How many workers should hold ``key``: 1 up to a share of ``1.25 / n``, then
        ``ceil(share * n - SLACK + HEADROOM * cold_share)``, at most ``n``."""
        if n_workers <= 1 or self._total < self._min_total:
            return 1  # too few requests seen for a share to mean anything
        load = self.share(key) * n_workers  # in workers' fair shares
        # SLACK: the decayed share of a steady 1/n of the traffic wanders by a few points,
        # and k should not flap with it. HEADROOM: holders also serve other prefixes
        # that were placed there before this one grew hot; k = share * n exactly left
        # them overloaded in the Zipf gsp of ``token-gateway bench policies``.
        # Headroom only for the traffic that is not on hot prefixes (see the module docstring).
        if load <= 1 + SLACK:
            return 1
        return max(1, min(n_workers, math.ceil(load - SLACK + HEADROOM * self.cold_share())))

    def observe(self, key: int | None, n_workers: int = 0) -> None:
        """One request with ``key`` was dispatched (advances the logical clock); with the
        pool size, the key's hot flag (``cold_share``) is refreshed too.

        ``None``: a request with no shared prefix long enough to key. It moves no share
        (shares are of the keyed traffic) and only counts as a request seen (``top_load``).
        """
        self._seen += 1
        if key is None:
            return
        self._tick += 1
        self._total = self._total * self._decay + 1.0
        self._hot_mass *= self._decay
        e = self._entries.get(key)
        if e is None:
            if len(self._entries) >= self.max_tracked:
                self._trim()
            e = self._entries[key] = _Entry(self._tick)
        e.count = self._value(e) + 1.0
        if e.hot:
            self._hot_mass += 1.0
        if n_workers > 1 and self._tick >= TOP_MIN_REQUESTS:
            # (not before: with fewer requests than workers every key reads as hot)
            hot = e.count / self._total * n_workers > 1 + SLACK
            if hot != e.hot:
                e.hot = hot
                self._hot_mass += e.count if hot else -e.count
        # Every count decays by the same factor, so only the observed key can overtake the top.
        top = self._top
        if top is None or (top is not e and self._value(top) < e.count):
            self._top = e

    def holders(self, key: int) -> list[str]:
        """The replica set of ``key`` in the order holders were added (a copy)."""
        e = self._entries.get(key)
        return list(e.holders) if e is not None else []

    def add_holder(self, key: int, worker_id: str) -> None:
        e = self._entries.get(key)
        if e is None:
            e = self._entries[key] = _Entry(self._tick)
        if worker_id not in e.holders:
            e.holders.append(worker_id)

    def drop_workers(self, gone: Iterable[str]) -> None:
        """Forget departed workers in every replica set."""
        gone = set(gone)
        if gone:
            for e in self._entries.values():
                if e.holders:
                    e.holders = [w for w in e.holders if w not in gone]

    def hot(self, n_workers: int) -> list[tuple[int, float, list[str]]]:
        """(key, share, holders) of the keys that need more than one worker, hottest first."""
        out = []
        for key, e in self._entries.items():
            s = self.share(key)
            if s * n_workers > 1 + SLACK:
                out.append((key, s, list(e.holders)))
        out.sort(key=lambda r: -r[1])
        return out

    def __len__(self) -> int:
        return len(self._entries)

    def _trim(self) -> None:
        """Drop the coldest half of the tracked keys (amortised O(1) per observe)."""
        ranked = sorted(self._entries.items(), key=lambda kv: self._value(kv[1]))
        for key, e in ranked[: len(ranked) // 2]:
            if e.hot:
                self._hot_mass -= e.count
            del self._entries[key]
        if self._top is not None and all(e is not self._top for e in self._entries.values()):
            self._top = max(self._entries.values(), key=self._value, default=None)
