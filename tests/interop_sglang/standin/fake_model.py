"""The stand-in scheduler's "model": a deterministic next-token rule.

No weights run on this machine, so the next token is a pure function of the
request's sampling seed and the output position: a test computes the same
sequence and knows, before sending, which id comes at which step (to pick a
stop id, to check a seeded request is reproducible). Standard library only, so
both the interop virtualenv and the project's tests import it.
"""

from __future__ import annotations

import hashlib
import math

# Ordinary Qwen3 vocabulary ids (plain-text byte-level BPE tokens), far from the
# special tokens at 151643 and above.
FIRST_ID = 1000
ID_SPAN = 20000
TOP_SPREAD = 7  # distance between an output id and its runner-up candidates
# The model ends its answer (Qwen3's <|im_end|>) at this output position, so a
# request that sets no max_tokens still finishes, as a real model's would.
EOS_ID = 151645
EOS_AT = 48


def _draw(seed: int, position: int) -> int:
    digest = hashlib.blake2b(f"{seed}:{position}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def next_token(seed: int | None, position: int) -> int:
    """The id emitted at output ``position`` (0-based) for a request seeded ``seed``."""
    if position == EOS_AT:
        return EOS_ID
    return FIRST_ID + _draw(seed or 0, position) % ID_SPAN


def sequence(seed: int | None, length: int) -> list[int]:
    return [next_token(seed, i) for i in range(length)]


def token_logprob(token_id: int, position: int) -> float:
    """A stable, negative log-probability for an id at a position."""
    return -0.05 - (token_id * 31 + position) % 97 / 40.0


def top_candidates(chosen: int, position: int, k: int) -> tuple[list[float], list[int]]:
    """``k`` (logprob, id) candidates, best first, the chosen id among them."""
    ids = [chosen] + [chosen + TOP_SPREAD * (j + 1) for j in range(max(k - 1, 0))]
    base = token_logprob(chosen, position)
    vals = [base - j * math.log(2) for j in range(len(ids))]
    return vals[:k], ids[:k]
