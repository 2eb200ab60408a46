"""How deep into a prompt a ring key must reach to say something, learned from the traffic.

A ring key is the chained hash of a prompt's first D tokens. A fixed D fails on real
traffic: when every request starts with the same D tokens (one system prompt, a
template header longer than D) every request gets the same key, the ring sends them all
to one worker, bounded load scatters the overflow without regard to content, and the
hit rate falls below round robin's. A key carrying more than one worker's share of the
recent requests cannot stay on one worker anyway, so it tells the ring nothing it can use.

``KeyDepths`` keeps a ladder of depths (``base``, 2x, 3x ... up to ``max_tokens``) and a
sliding window of the keys recent prompts had at each rung. A prompt is keyed at the
shallowest rung whose key carried at most ``window / n_workers`` of the last ``window``
requests; a prompt all of whose rungs are that common is keyed at its deepest. Shallow
first keeps a conversation's turns (each a longer prompt with the same start) together
as long as their shared start is informative; rungs past a prompt's length add nothing.

State is a few thousand integers; no I/O. Replicas that see similar traffic learn
similar depths; ``window = 0`` turns learning off (the fixed depth ``base``).
"""

from __future__ import annotations

from array import array
from collections import Counter, deque
from collections.abc import Sequence

from gateway.policies.hashing import block_hashes, prefix_key, token_array

DEFAULT_WINDOW = 256
DEFAULT_MAX_TOKENS = 8192


def ladder(base: int, max_tokens: int) -> tuple[int, ...]:
    """Depths ``base``, ``2 * base``, ``3 * base`` ... up to ``max_tokens`` (at least ``base``).

    Even steps, not doubling: the first informative depth is usually just past a shared
    header, and a rung far past it would split a conversation whose turns share more."""
    base = max(base, 1)
    return tuple(range(base, max(base, max_tokens) + 1, base))


class KeyDepths:
    """The ladder of key depths and the window of recent keys at each rung."""

    def __init__(
        self, block_size: int, base_tokens: int, max_tokens: int = DEFAULT_MAX_TOKENS, window: int = DEFAULT_WINDOW
    ) -> None:
        if window < 0:
            raise ValueError("window must be >= 0")
        self.block_size = block_size
        self.depths = ladder(base_tokens, max_tokens) if window else (base_tokens,)
        self.window = window
        self._recent: deque[tuple[int, ...]] = deque()
        self._counts: Counter[int] = Counter()

    def keys(self, tokens: Sequence[int] | array) -> tuple[int, ...]:
        """The prompt's key at each rung it reaches (a rung past its length ends the ladder)."""
        arr = token_array(tokens)
        n = len(arr)
        blocks = block_hashes(arr[: min(n, self.depths[-1])], self.block_size)
        out = []
        for depth in self.depths:
            whole = min(depth, n) // self.block_size
            out.append(blocks[whole - 1].hash if whole else prefix_key(arr, self.block_size, depth))
            if depth >= n:
                break
        return tuple(out)

    def pick(self, keys: Sequence[int], n_workers: int) -> int:
        """Index of the rung to key on: the shallowest whose key is not over one worker's share."""
        if not self.window or n_workers <= 1:
            return 0
        limit = self.window / n_workers
        counts = self._counts
        for i, key in enumerate(keys):
            if counts[key] <= limit:
                return i
        return len(keys) - 1

    def share(self, key: int) -> float:
        """The share of the last ``window`` requests that had ``key`` at some rung."""
        return self._counts[key] / self.window if self.window else 0.0

    def record(self, keys: Sequence[int]) -> None:
        """A request with these rung keys was routed (the window slides by one)."""
        if not self.window:
            return
        entry = tuple(keys)
        self._recent.append(entry)
        self._counts.update(entry)
        if len(self._recent) > self.window:
            old = self._recent.popleft()
            self._counts.subtract(old)
            for key in old:
                if self._counts[key] <= 0:
                    del self._counts[key]
