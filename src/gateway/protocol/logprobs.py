"""Turn a worker's token ids and logprob floats into OpenAI logprob objects.

The worker knows only token ids; the gateway owns the tokenizer. The caller
passes ``piece(token_id) -> str`` (the tokenizer's text for one token) and these
helpers stay pure. Non-finite logprobs (``-inf`` for impossible tokens) become
-9999.0, the floor OpenAI itself reports, because JSON cannot carry infinity.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from gateway.protocol.responses import (
    ChoiceLogprobs,
    CompletionLogprobs,
    TokenLogprob,
    TopLogprob,
)

PieceFn = Callable[[int], str]
TopRow = Sequence[tuple[int, float]]
"""One position's alternatives: ``(token_id, logprob)`` pairs, most likely first."""

LOGPROB_FLOOR = -9999.0


def finite_logprob(value: float | None) -> float | None:
    if value is None:
        return None
    if math.isnan(value) or math.isinf(value):
        return LOGPROB_FLOOR
    return float(value)


def _row(top_rows: Sequence[TopRow | None] | None, i: int) -> TopRow:
    if top_rows is None or i >= len(top_rows):
        return ()
    return top_rows[i] or ()


def chat_logprobs(
    token_ids: Sequence[int],
    logprobs: Sequence[float],
    top_rows: Sequence[TopRow | None] | None,
    piece: PieceFn,
    *,
    top_n: int | None = None,
) -> ChoiceLogprobs:
    """Chat ``logprobs`` for some generated tokens (a whole answer or one chunk's worth).

    ``top_n`` trims each position's alternatives (None keeps what the worker sent).
    """
    content: list[TokenLogprob] = []
    for i, token_id in enumerate(token_ids):
        text = piece(token_id)
        row = _row(top_rows, i)
        if top_n is not None:
            row = row[:top_n]
        content.append(
            TokenLogprob(
                token=text,
                logprob=finite_logprob(logprobs[i]) or 0.0,
                bytes=list(text.encode("utf-8")),
                top_logprobs=[
                    TopLogprob(
                        token=(alt := piece(alt_id)),
                        logprob=finite_logprob(alt_lp) or 0.0,
                        bytes=list(alt.encode("utf-8")),
                    )
                    for alt_id, alt_lp in row
                ],
            )
        )
    return ChoiceLogprobs(content=content)


def completion_logprobs(
    token_ids: Sequence[int],
    logprobs: Sequence[float | None],
    top_rows: Sequence[TopRow | None] | None,
    piece: PieceFn,
    *,
    text_offset: int = 0,
    top_n: int | None = None,
) -> CompletionLogprobs:
    """Legacy completions ``logprobs`` for some tokens.

    ``text_offset`` is where the first token's text starts in the choice's text
    (pass the running length when streaming, or 0). A position without a logprob
    (the first prompt token under ``echo``) is null, as OpenAI reports it (the
    ``openai`` SDK's types say float, but the SDK does not validate what it reads). Two
    alternatives with the same text keep the larger logprob, since the JSON
    object is keyed by text.
    """
    tokens: list[str] = []
    values: list[float | None] = []
    tops: list[dict[str, float] | None] = []
    offsets: list[int] = []
    offset = text_offset
    want_tops = top_rows is not None
    for i, token_id in enumerate(token_ids):
        text = piece(token_id)
        tokens.append(text)
        values.append(finite_logprob(logprobs[i]) if i < len(logprobs) else None)
        offsets.append(offset)
        offset += len(text)
        if want_tops:
            row = _row(top_rows, i)
            if top_n is not None:
                row = row[:top_n]
            if not row:
                tops.append(None if values[-1] is None else {})
                continue
            alternatives: dict[str, float] = {}
            for alt_id, alt_lp in row:
                alt = piece(alt_id)
                value = finite_logprob(alt_lp) or 0.0
                if alt not in alternatives or value > alternatives[alt]:
                    alternatives[alt] = value
            tops.append(alternatives)
    return CompletionLogprobs(
        tokens=tokens,
        token_logprobs=values,
        top_logprobs=tops if want_tops else None,
        text_offset=offsets,
    )


def sglang_logprob_rows(
    token_ids: Sequence[int],
    logprobs: Sequence[float | None],
    piece: PieceFn | None = None,
) -> list[list[float | int | str | None]]:
    """SGLang /generate rows ``[logprob, token_id, text_or_null]`` (text if ``piece`` given)."""
    return [
        [
            finite_logprob(logprobs[i]) if i < len(logprobs) else None,
            token_id,
            piece(token_id) if piece is not None else None,
        ]
        for i, token_id in enumerate(token_ids)
    ]


def sglang_top_rows(
    top_rows: Sequence[TopRow | None],
    piece: PieceFn | None = None,
) -> list[list[list[float | int | str | None]] | None]:
    """SGLang /generate top-logprob lists: per position, rows ``[logprob, token_id, text]``."""
    out: list[list[list[float | int | str | None]] | None] = []
    for row in top_rows:
        if row is None:
            out.append(None)
            continue
        out.append(
            [
                [finite_logprob(lp), tid, piece(tid) if piece is not None else None]
                for tid, lp in row
            ]
        )
    return out
