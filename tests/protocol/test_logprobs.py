"""Logprob objects from a worker's ids and floats (protocol/logprobs.py): chat and legacy
completions shapes, SGLang's rows, trimming, and JSON-safe values for -inf and NaN."""

from __future__ import annotations

import math

from gateway.protocol.logprobs import (
    LOGPROB_FLOOR,
    chat_logprobs,
    completion_logprobs,
    finite_logprob,
    sglang_logprob_rows,
    sglang_top_rows,
)

PIECES = {1: "Hel", 2: "lo", 3: "é", 4: "lo", 5: "!"}


def piece(token_id: int) -> str:
    return PIECES[token_id]


def test_non_finite_values_become_openais_floor() -> None:
    assert finite_logprob(None) is None
    assert finite_logprob(-math.inf) == finite_logprob(math.nan) == finite_logprob(math.inf) == LOGPROB_FLOOR
    assert finite_logprob(-0.5) == -0.5


def test_chat_logprobs_carry_text_bytes_and_trimmed_alternatives() -> None:
    out = chat_logprobs([1, 3], [-0.1, -math.inf], [[(1, -0.1), (2, -2.0), (5, -3.0)], None], piece, top_n=2)
    first, second = out.content
    assert (first.token, first.logprob, first.bytes) == ("Hel", -0.1, list(b"Hel"))
    assert [(t.token, t.logprob) for t in first.top_logprobs] == [("Hel", -0.1), ("lo", -2.0)]
    assert (second.token, second.logprob, second.bytes) == ("é", LOGPROB_FLOOR, [0xC3, 0xA9])
    assert second.top_logprobs == []  # the worker sent no row for it
    untrimmed = chat_logprobs([1], [-0.1], [[(1, -0.1), (2, -2.0), (5, -3.0)]], piece)
    assert len(untrimmed.content[0].top_logprobs) == 3
    assert chat_logprobs([1], [-0.1], None, piece).content[0].top_logprobs == []


def test_completion_logprobs_offsets_nulls_and_duplicate_texts() -> None:
    out = completion_logprobs([1, 2, 5], [None, -0.5], [None, [(2, -0.5), (4, -0.2), (5, -4.0)], []], piece, text_offset=10)
    assert out.tokens == ["Hel", "lo", "!"]
    assert out.token_logprobs == [None, -0.5, None]  # an echoed first prompt token has no logprob
    assert out.text_offset == [10, 13, 15]
    assert out.top_logprobs == [None, {"lo": -0.2, "!": -4.0}, None]  # same text: the larger logprob
    assert completion_logprobs([1], [-1.0], None, piece).top_logprobs is None
    assert completion_logprobs([1], [-1.0], [[]], piece).top_logprobs == [{}]
    trimmed = completion_logprobs([1], [-1.0], [[(1, -1.0), (2, -2.0)]], piece, top_n=1)
    assert trimmed.top_logprobs == [{"Hel": -1.0}]


def test_sglang_rows_with_and_without_text() -> None:
    assert sglang_logprob_rows([1, 2], [-0.5, -math.inf], piece) == [[-0.5, 1, "Hel"], [LOGPROB_FLOOR, 2, "lo"]]
    assert sglang_logprob_rows([1, 2], [-0.5]) == [[-0.5, 1, None], [None, 2, None]]
    assert sglang_top_rows([[(1, -0.1), (5, math.nan)], None], piece) == [[[-0.1, 1, "Hel"], [LOGPROB_FLOOR, 5, "!"]], None]
    assert sglang_top_rows([[(2, -1.0)]]) == [[[-1.0, 2, None]]]
