"""Live routing quality of one pool: the ideal hit rate of the traffic offered, the achieved
one, the policy's predictions, and the tokenizer-fidelity guard.

An operator wants three numbers side by side, per model and pool:

* **ideal** -- what an infinite shared cache would have hit on the prompts actually
  offered. ``OfferedPrefixes`` keeps a *bounded* sketch of the prefixes seen: a radix
  tree (``radix_tree.RadixTree``) with one pseudo-worker whose LRU budget is
  ``sketch_tokens``. Each offered prompt is matched (longest prefix seen before, whole
  pages, at most ``prompt - 1`` tokens as a worker would count it) and then inserted.
  The tree compares packed token runs with ``memcmp`` instead of hashing every block,
  so the sketch costs one walk and one insert per request; memory is bounded by the
  budget. With a budget above the traffic's working set the figure is exactly the
  ideal of ``bench.workloads.ideal_hit_rate``; below it, the ideal of an LRU cache of
  that size (a lower bound).
* **achieved** -- cached tokens the workers reported over prompt tokens sent.
* **predicted** -- what the policy expected the chosen worker to hold.

``FidelityGuard`` compares the prompt length the gateway sent with the ``prompt_tokens``
the worker reported. A worker that counts differently (another tokenizer or chat
template, a BOS it adds itself) caches token sequences the gateway's tree does not
know, so prefix routing for that model is guesswork: after ``trip_after`` mismatches
in a row the model is *tripped* (the router routes it by load only) until
``clear_after`` consecutive finishes agree again. Pure and synchronous.
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from dataclasses import dataclass, field

from gateway.policies.radix_tree import RadixTree, pack

DEFAULT_SKETCH_TOKENS = 1 << 22  # 4 Mi tokens: well above the KV of a typical pool's hot set
DEFAULT_TRIP_AFTER = 3
DEFAULT_CLEAR_AFTER = 16
_SKETCH = "*"


class OfferedPrefixes:
    """A bounded LRU sketch of the prompt prefixes offered to a pool (see the module docstring)."""

    def __init__(self, sketch_tokens: int = DEFAULT_SKETCH_TOKENS, page_size: int = 1) -> None:
        if sketch_tokens < 1:
            raise ValueError("the prefix sketch needs a budget of at least one token")
        self.page_size = max(1, page_size)
        self._tree = RadixTree(default_budget_tokens=sketch_tokens, max_total_tokens=sketch_tokens)
        self._tree.set_worker(_SKETCH, budget_tokens=sketch_tokens, page_size=1)
        self.prompt_tokens = 0
        self.ideal_cached_tokens = 0
        self.prompts = 0

    def offer(self, tokens: Sequence[int] | array | bytes) -> int:
        """Count one offered prompt; returns the tokens an ideal shared cache would hit."""
        pb = pack(tokens)
        n = len(pb) >> 2
        if n == 0:
            return 0
        found = self._tree.match_packed(pb)[0]
        hit = min(found, n - 1)
        hit -= hit % self.page_size
        self._tree.insert_packed(pb, _SKETCH)
        self.prompts += 1
        self.prompt_tokens += n
        self.ideal_cached_tokens += hit
        return hit

    @property
    def ideal_hit_rate(self) -> float:
        return self.ideal_cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    @property
    def sketch_tokens(self) -> int:
        return self._tree.total_tokens


@dataclass(slots=True)
class FidelityGuard:
    """Sent vs reported prompt lengths of one model: trips to load-only routing on divergence."""

    trip_after: int = DEFAULT_TRIP_AFTER
    clear_after: int = DEFAULT_CLEAR_AFTER
    mismatches: int = 0  # lifetime count
    checked: int = 0
    tripped: bool = False
    last_sent: int = 0
    last_reported: int = 0
    _bad_run: int = 0
    _good_run: int = 0

    def check(self, sent: int, reported: int) -> bool | None:
        """Record one finish; returns the new state when it changed (True: tripped), else None.

        A report of 0 (a worker that does not fill ``prompt_tokens``) is no evidence.
        """
        if reported <= 0 or sent <= 0:
            return None
        self.checked += 1
        if sent != reported:
            self.mismatches += 1
            self.last_sent, self.last_reported = sent, reported
            self._bad_run += 1
            self._good_run = 0
            if not self.tripped and self._bad_run >= self.trip_after:
                self.tripped = True
                return True
        else:
            self._good_run += 1
            self._bad_run = 0
            if self.tripped and self._good_run >= self.clear_after:
                self.tripped = False
                return False
        return None


@dataclass(slots=True)
class PoolQuality:
    """Everything ``/metrics`` and ``inspect`` show about one (model, pool)'s routing quality."""

    offered: OfferedPrefixes = field(default_factory=OfferedPrefixes)
    guard: FidelityGuard = field(default_factory=FidelityGuard)
    finished: int = 0
    prompt_tokens: int = 0  # of successful streams, as sent
    predicted_cached_tokens: int = 0
    reported_cached_tokens: int = 0

    def finish(self, *, sent_prompt: int, predicted_cached: int, reported_cached: int, success: bool) -> None:
        if not success:
            return
        self.finished += 1
        self.prompt_tokens += sent_prompt
        self.predicted_cached_tokens += predicted_cached
        self.reported_cached_tokens += reported_cached

    def snapshot(self) -> dict[str, object]:
        """Plain figures, for ``inspect`` and the admin API."""
        sent = self.prompt_tokens
        return {
            "offered_prompts": self.offered.prompts,
            "offered_prompt_tokens": self.offered.prompt_tokens,
            "ideal_cached_tokens": self.offered.ideal_cached_tokens,
            "ideal_hit_rate": round(self.offered.ideal_hit_rate, 4),
            "sketch_tokens": self.offered.sketch_tokens,
            "finished": self.finished,
            "prompt_tokens": sent,
            "predicted_cached_tokens": self.predicted_cached_tokens,
            "reported_cached_tokens": self.reported_cached_tokens,
            "predicted_hit_rate": round(self.predicted_cached_tokens / sent, 4) if sent else 0.0,
            "achieved_hit_rate": round(self.reported_cached_tokens / sent, 4) if sent else 0.0,
            "tokenizer_mismatches": self.guard.mismatches,
            "load_only": self.guard.tripped,
        }
