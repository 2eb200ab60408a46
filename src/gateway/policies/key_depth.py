"""How deep into a prompt a ring key must reach to say something, learned from the traffic.

A ring key is the chained hash of a prompt's first D tokens. A fixed D fails on real
traffic: when every request starts with the same D tokens (one system prompt, a
template header longer than D) every request gets the same key, the ring sends them all
to one worker, bounded load scatters the overflow without regard to content, and the
hit rate falls below round robin's. A key carrying most of the recent requests tells
the ring nothing it can use.

``KeyDepths`` keeps a ladder of depths (``base``, 2x, 3x ... up to ``max_tokens``) and a
sliding window of the keys recent prompts walked through. A prompt is keyed at the
shallowest rung whose key is not *common*: carried by more than ``max_share`` (never
less than one worker's share) of the window's requests that reached that rung, and by
at least ``MIN_SAMPLES`` of them. A prompt all of whose rungs are common is keyed at its
deepest. Shallow first keeps a conversation's turns (each a longer prompt with the same
start) together as long as their shared start is informative. Measuring a rung among
the requests that reached it finds a long shared header a few requests per rung, not a
window per rung.

State is a few thousand integers; no I/O. Replicas that see similar traffic learn
similar depths; ``window = 0`` turns learning off (the fixed depth ``base``).
"""

from __future__ import annotations

from array import array
from collections import Counter, deque
from collections.abc import Sequence

import xxhash

from gateway.policies.hashing import pack_tokens, prefix_key, token_array

_xxh3 = xxhash.xxh3_64_intdigest

DEFAULT_WINDOW = 256
DEFAULT_MAX_TOKENS = 8192
# A key on more than this share of the recent requests is what (almost) all of them share.
# Below it, bounded load already spreads a popular key over a few workers clockwise, which
# keeps its prefix on fewer workers than keying its requests deeper (at random) would.
DEFAULT_MAX_SHARE = 0.5
MIN_SAMPLES = 16  # a key is common only once this many requests of the window carried it


def ladder(base: int, max_tokens: int) -> tuple[int, ...]:
    """Depths ``base``, ``2 * base``, ``3 * base`` ... up to ``max_tokens`` (at least ``base``).

    Even steps, not doubling: the first informative depth is usually just past a shared
    header, and a rung far past it would split a conversation whose turns share more."""
    base = max(base, 1)
    return tuple(range(base, max(base, max_tokens) + 1, base))


class KeyDepths:
    """The ladder of key depths and the window of recent keys at each rung.

    Rung 0's key is ``hashing.prefix_key`` at ``base`` (what a fixed-depth ring uses, and
    ``inspect`` shows); each deeper rung's key chains the next ``base`` tokens (whole
    blocks, capped by the prompt) onto the previous key with one xxh3 call, so a request
    that stops at rung 0 costs what the fixed depth cost, and one that goes deeper pays
    one hash per rung. Only the rungs a request walked are counted.
    """

    def __init__(
        self, block_size: int, base_tokens: int, max_tokens: int = DEFAULT_MAX_TOKENS, window: int = DEFAULT_WINDOW,
        max_share: float = DEFAULT_MAX_SHARE,
    ) -> None:
        if window < 0:
            raise ValueError("window must be >= 0")
        if not 0 < max_share <= 1:
            raise ValueError("max_share must be in (0, 1]")
        self.max_share = max_share
        self.block_size = block_size
        self.depths = ladder(base_tokens, max_tokens) if window else (base_tokens,)
        self.window = window
        self._recent: deque[tuple[int, ...]] = deque()
        self._counts: Counter[int] = Counter()
        self._reached: Counter[int] = Counter()  # rung index -> requests of the window that reached it

    def _rungs(self, tokens: Sequence[int] | array, share: float | None) -> list[int]:
        """Rung keys from the base down; with ``share``, stop at the first that is not common."""
        arr = token_array(tokens)
        n = len(arr)
        bs = self.block_size
        key = prefix_key(arr, bs, self.depths[0])
        keys = [key]
        end = min(self.depths[0], n) // bs * bs
        if end == 0 or self.depths[0] >= n:
            return keys
        data = b""
        for depth in self.depths[1:]:
            if share is not None and not self._common(key, len(keys) - 1, share):
                break
            nxt = min(depth, n) // bs * bs
            if nxt <= end:
                break
            if not data:
                data = pack_tokens(arr[: min(n, self.depths[-1])])
            key = _xxh3(data[4 * end : 4 * nxt], key)
            keys.append(key)
            end = nxt
        return keys

    def keys(self, tokens: Sequence[int] | array) -> tuple[int, ...]:
        """The prompt's key at every rung it reaches (a rung past its length ends the ladder)."""
        return tuple(self._rungs(tokens, None))

    def route(self, tokens: Sequence[int] | array, n_workers: int) -> tuple[int, ...]:
        """The rung keys walked for this prompt: the last is its ring key (see the module doc)."""
        if not self.window or n_workers <= 1:
            return (prefix_key(tokens, self.block_size, self.depths[0]),)
        return tuple(self._rungs(tokens, self.max_share_for(n_workers)))

    def max_share_for(self, n_workers: int) -> float:
        """The share of a rung's requests a key may carry and still be informative."""
        return max(self.max_share, 1 / max(1, n_workers))

    def _common(self, key: int, rung: int, share: float) -> bool:
        n = self._counts[key]
        return n >= MIN_SAMPLES and n > share * self._reached[rung]

    def pick(self, keys: Sequence[int], n_workers: int) -> int:
        """Index of the rung to key on among ``keys`` (all of a prompt's rungs)."""
        if not self.window or n_workers <= 1:
            return 0
        share = self.max_share_for(n_workers)
        for i, key in enumerate(keys):
            if not self._common(key, i, share):
                return i
        return len(keys) - 1

    def seen(self, key: int) -> bool:
        """Whether a request of the window walked through ``key``."""
        return key in self._counts

    def share(self, key: int) -> float:
        """The share of the last ``window`` requests that walked through ``key``."""
        return self._counts[key] / self.window if self.window else 0.0

    def record(self, keys: Sequence[int]) -> None:
        """A request that walked these rung keys was routed (the window slides by one)."""
        if not self.window:
            return
        entry = tuple(keys)
        self._recent.append(entry)
        self._counts.update(entry)
        self._reached.update(range(len(entry)))
        if len(self._recent) > self.window:
            old = self._recent.popleft()
            self._counts.subtract(old)
            self._reached.subtract(range(len(old)))
            for key in old:
                if self._counts[key] <= 0:
                    del self._counts[key]
