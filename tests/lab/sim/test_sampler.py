"""Deterministic model outputs (gateway_lab/sim/sampler.py): a function of the prompt, the
sample index and the seed; scripted replies first; plausible alternatives and vectors."""

from __future__ import annotations

import math

from gateway_lab.sim.sampler import (
    TokenSource,
    embedding,
    input_logprob,
    prompt_digest,
    top_alternatives,
)
from gateway_lab.sim.vocab import load_vocab


def _stream(source: TokenSource, n: int, eos_allowed: bool = True) -> list[tuple[int, float, bool]]:
    return [source.next(eos_allowed) for _ in range(n)]


def test_the_same_prompt_index_and_seed_give_the_same_stream() -> None:
    vocab = load_vocab()
    digest = prompt_digest([1, 2, 3], seed=0)
    assert digest == prompt_digest([1, 2, 3], seed=0) != prompt_digest([1, 2, 3], seed=1) != prompt_digest([1, 2], seed=0)
    a = _stream(TokenSource(vocab, digest, 0, 0.0), 20)
    assert a == _stream(TokenSource(vocab, digest, 0, 0.0), 20)
    assert a != _stream(TokenSource(vocab, digest, 1, 0.0), 20)  # each sample of n differs
    assert all(t in vocab.output_ids and not eos and lp < 0 for t, lp, eos in a)


def test_eos_only_when_allowed_and_scripts_come_first() -> None:
    vocab = load_vocab()
    digest = prompt_digest([5], seed=0)
    always = TokenSource(vocab, digest, 0, 1.0)
    assert not any(eos for _, _, eos in _stream(always, 5, eos_allowed=False))  # min_new_tokens not reached
    token, _, eos = always.next(True)
    assert eos and token == vocab.eos_ids[0]
    scripted = TokenSource(vocab, digest, 0, 0.0, script=[11, 12])
    out = _stream(scripted, 3)
    assert [t for t, _, _ in out[:2]] == [11, 12] and out[2][2] and out[2][0] == vocab.eos_ids[0]
    assert scripted.pos == 3


def test_alternatives_logprobs_and_embeddings() -> None:
    vocab = load_vocab()
    values, ids = top_alternatives(vocab, vocab.output_ids[0], -0.5, 4)
    assert ids[0] == vocab.output_ids[0] and len(set(ids)) == 4 and values[0] == -0.5
    assert values == sorted(values, reverse=True)
    assert top_alternatives(vocab, 5, -1.0, 0) == ([], [])
    assert input_logprob(1, 2) == input_logprob(1, 2) < 0
    vec = embedding([1, 2, 3], seed=0, dim=16)
    assert len(vec) == 16 and math.isclose(sum(x * x for x in vec), 1.0) and vec == embedding([1, 2, 3], 0, 16)
    assert vec != embedding([1, 2, 4], 0, 16)
