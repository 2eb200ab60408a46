"""Counting a reply's reasoning tokens (``usage.completion_tokens_details.reasoning_tokens``).

A token is a reasoning token when it lies inside the reasoning block: from the
block's start tag to its end tag, both included, or from the first token when the
chat template already opened the block. The block is recognised where the
reasoning parsers recognise it, at the very start of the output; a reply that
does not open with the start tag has none (Qwen3 with thinking off, or a
thinking model that answered directly: 0, not every token).

The count is the gateway's own: a worker's ``reasoning_tokens`` counts every token
before the end tag as reasoning, even in a reply that never opened the block, so it
is not used (docs/sglang-mapping.md). It is billing-visible, hence token-exact.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Literal

_State = Literal["start", "reasoning", "done"]


class ReasoningTokenCounter:
    """Counts one sample's reasoning tokens as its token ids arrive."""

    __slots__ = ("_end", "_start", "_state", "count")

    def __init__(self, start_id: int | None, end_id: int, *, starts_in_reasoning: bool = False) -> None:
        self._start = start_id
        self._end = end_id
        self._state: _State = "reasoning" if starts_in_reasoning else "start"
        self.count = 0

    @property
    def done(self) -> bool:
        """The count is final: later ids are not fed through."""
        return self._state == "done"

    def feed(self, token_ids: Iterable[int]) -> None:
        state = self._state
        if state == "done":
            return
        for t in token_ids:
            if state == "start":
                if t != self._start:
                    state = "done"
                    break
                state = "reasoning"
                self.count += 1
            elif t == self._end:
                self.count += 1
                state = "done"
                break
            else:
                self.count += 1
        self._state = state
