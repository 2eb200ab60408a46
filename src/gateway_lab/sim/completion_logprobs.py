"""The ``logprobs`` object of a ``/v1/completions`` choice, shaped as vLLM's server shapes it.

vLLM answers ``"logprobs": k`` with four lists per choice (``tokens``, ``token_logprobs``,
``top_logprobs``, ``text_offset``), one row per token: the sampled token's logprob and a
row of the sampled token plus the top ``k`` candidates (``{name: logprob}``; ``k`` = 0 gives
the sampled token alone). With ``echo`` the prompt's rows come first (its first token's
logprob and row null), whole or on each choice's first streamed chunk, while
``token_ids`` still carries the output's ids only. Tokens are named ``token_id:N`` when
the request asks with ``return_tokens_as_token_ids``, else by their text. Offsets go on
from the choice's previous object, each row adding its token name's length, as vLLM counts
them (by the tokens reported, not by the text sent). The rows come from the servicer's messages; this module only
keeps them per choice until the object that carries them is written.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from gateway.proto import sglang_scheduler_pb2 as pb

# vLLM writes -inf as the JSON-safe floor OpenAI uses.
_FLOOR = -9999.0

Row = tuple[int, float | None, list[tuple[int, float]] | None]


@dataclass
class LogprobRows:
    """Rows per choice, from the servicer's messages to the completion objects.

    ``k`` is the request's ``logprobs`` (None: not asked, nothing is kept or written);
    ``name`` names a token as the answer does."""

    k: int | None
    name: Callable[[int], str]
    _rows: dict[int, list[Row]] = field(default_factory=dict)
    _offsets: dict[int, int] = field(default_factory=dict)  # per choice, the next row's text offset

    def add_prompt(self, index: int, rows: pb.InputLogProbs) -> None:
        """The prompt's rows (echo), ahead of anything else of choice ``index``."""
        if self.k is None:
            return
        out = self._rows.setdefault(index, [])
        tops = list(rows.top_logprobs)
        for pos, (value, token) in enumerate(zip(rows.token_logprobs, rows.token_ids, strict=False)):
            if not value.HasField("value"):
                out.append((token, None, None))
                continue
            top = tops[pos] if pos < len(tops) else None
            out.append((token, value.value, self._top(token, value.value, top)))

    def add_output(self, index: int, rows: pb.OutputLogProbs, count: int) -> None:
        """The last ``count`` output rows of a message (the tokens it newly sent)."""
        if self.k is None or count <= 0:
            return
        out = self._rows.setdefault(index, [])
        tops = list(rows.top_logprobs)
        values, tokens = list(rows.token_logprobs), list(rows.token_ids)
        first = max(0, len(tokens) - count)
        for pos in range(first, len(tokens)):
            top = tops[pos] if pos < len(tops) else None
            out.append((tokens[pos], values[pos], self._top(tokens[pos], values[pos], top)))

    def _top(self, token: int, value: float, top: pb.TopLogProbs | None) -> list[tuple[int, float]]:
        pairs = list(zip(top.token_ids, top.values, strict=False)) if top is not None else []
        if all(t != token for t, _ in pairs):
            pairs.insert(0, (token, value))  # vLLM's row always holds the sampled token
        return pairs[: (self.k or 0) + 1]

    def take(self, index: int) -> dict[str, Any] | None:
        """The ``logprobs`` object of choice ``index``'s next completion object, its rows spent."""
        if self.k is None:
            return None
        rows = self._rows.pop(index, [])
        tokens: list[str] = []
        offsets: list[int] = []
        offset = self._offsets.get(index, 0)
        for token, _, _ in rows:
            name = self.name(token)
            offsets.append(offset)
            offset += len(name)
            tokens.append(name)
        self._offsets[index] = offset
        return {
            "text_offset": offsets,
            "token_logprobs": [None if v is None else max(v, _FLOOR) for _, v, _ in rows],
            "tokens": tokens,
            "top_logprobs": [
                None if top is None else {self.name(t): max(v, _FLOOR) for t, v in top} for _, _, top in rows
            ],
        }


__all__ = ["LogprobRows"]
