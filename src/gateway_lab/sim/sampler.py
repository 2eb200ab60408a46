"""Deterministic stand-ins for a model's outputs: tokens, logprobs, embeddings.

Same prompt ids + same sample index + same seed always give the same token
stream, whatever the chunking, streaming mode or sampling knobs: each position
draws a fixed amount of randomness, and the knobs (max_new_tokens, stop ids,
min_new_tokens, ignore_eos) only decide where the stream is cut.
"""

from __future__ import annotations

import math
import random
import sys
from array import array
from collections.abc import Sequence

import xxhash

from gateway_lab.sim.vocab import Vocab

_MASK64 = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15


def prompt_digest(prompt: Sequence[int], seed: int) -> int:
    """A 64-bit digest of the prompt ids under ``seed``."""
    data = array("I", prompt)
    if sys.byteorder == "big":
        data.byteswap()
    return xxhash.xxh3_64_intdigest(data.tobytes(), seed=seed & _MASK64)


class TokenSource:
    """The output stream of one sample.

    ``script`` (from a ``<<sim-reply>>`` marker) replaces the random tokens at
    the start; EOS follows it as soon as EOS is allowed. Otherwise each token
    is EOS with probability ``eos_probability`` when EOS is allowed.
    """

    __slots__ = ("_eos", "_ids", "_n", "_p_eos", "_rng", "_script", "pos")

    def __init__(
        self,
        vocab: Vocab,
        digest: int,
        index: int,
        eos_probability: float,
        script: list[int] | None = None,
    ) -> None:
        self._rng = random.Random((digest ^ ((index + 1) * _GOLDEN)) & _MASK64)
        self._ids = vocab.output_ids
        self._n = len(vocab.output_ids)
        self._eos = vocab.eos_ids[0]
        self._p_eos = eos_probability
        self._script = script
        self.pos = 0

    def next(self, eos_allowed: bool) -> tuple[int, float, bool]:
        """(token id, its logprob, whether it is the EOS token)."""
        rnd = self._rng.random
        u_eos, u_tok, u_lp = rnd(), rnd(), rnd()
        pos = self.pos
        self.pos = pos + 1
        logprob = -(0.005 + 2.5 * u_lp * u_lp)
        script = self._script
        if script is not None:
            if pos < len(script):
                return script[pos], logprob, False
            if eos_allowed:
                return self._eos, logprob, True
        elif eos_allowed and u_eos < self._p_eos:
            return self._eos, logprob, True
        return self._ids[int(u_tok * self._n)], logprob, False


def top_alternatives(
    vocab: Vocab, token: int, logprob: float, k: int
) -> tuple[list[float], list[int]]:
    """``k`` plausible top candidates: the chosen token first, then lower-valued ids."""
    if k <= 0:
        return [], []
    ids = vocab.output_ids
    n = len(ids)
    values = [logprob]
    out = [token]
    j = 1
    while len(out) < k:
        cand = ids[(token * 7919 + j * 104729) % n]
        j += 1
        if cand != token:
            out.append(cand)
            values.append(logprob - 0.4 * (len(out) - 1) - 0.1)
    return values, out


def input_logprob(prev: int, token: int) -> float:
    """A plausible logprob of a prompt token given the previous one."""
    return -(0.05 + ((prev * 2654435761 + token * 40503) % 1000) / 125.0)


def embedding(prompt: Sequence[int], seed: int, dim: int) -> list[float]:
    """A deterministic unit vector for the prompt ids."""
    rng = random.Random(prompt_digest(prompt, seed ^ 0x5EED))
    vec = [rng.gauss(0.0, 1.0) for _ in range(dim)]
    norm = math.sqrt(sum(x * x for x in vec)) or 1.0
    return [x / norm for x in vec]
