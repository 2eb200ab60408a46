"""What a worker may send back for one request, checked as its tokens arrive.

A worker is trusted no more than a client: it may not return more tokens per sample
than the request asked for (a broken or hostile worker that keeps streaming would
otherwise hold the request, its slot and the event loop for as long as it likes),
and every id it returns must be in the model's vocabulary (an id past it has no
text, and passing it on would hand the client something no model produced).
``Generation`` asks the guard about every message that is not the common one-token
case, and checks that case inline with the same two comparisons.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

from gateway.pipeline.prepared import PreparedRequest
from gateway.protocol.errors import WorkerError

log = logging.getLogger(__name__)

OUTPUT_CEILING = 1 << 20
"""Most tokens one sample may bring back when neither the request, the operator's
``--max-tokens-cap`` nor the model's context length says how many."""


@dataclass(slots=True, frozen=True)
class OutputGuard:
    cap: int  # most tokens one sample may bring back
    vocab: int  # ids must be below this

    @classmethod
    def for_request(cls, prepared: PreparedRequest) -> OutputGuard:
        asked = prepared.sampling.max_new_tokens
        cap = asked if asked is not None and asked > 0 else (prepared.output_room or OUTPUT_CEILING)
        return cls(cap=cap, vocab=prepared.tokenizer.vocab_size)

    def admit(self, ids: Sequence[int], generated: int, *, request_id: str, worker_id: str, index: int) -> tuple[list[int], bool]:
        """The ids a sample that already has ``generated`` tokens may take, and whether the
        worker went past the cap (the sample then ends with ``length``). An id outside the
        vocabulary is a worker error (502), logged once here."""
        room = self.cap - generated
        over = len(ids) > room
        taken = list(ids[: max(room, 0)]) if over else list(ids)
        if taken and max(taken) >= self.vocab:
            bad = next(t for t in taken if t >= self.vocab)
            log.warning(
                "request %s: worker %s sent token id %d outside the vocabulary [0, %d); request failed",
                request_id, worker_id, bad, self.vocab,
            )
            raise WorkerError(f"worker {worker_id} sent token id {bad}, outside the model's vocabulary [0, {self.vocab})")
        if over:
            log.warning(
                "request %s: worker %s sent more than the %d tokens asked for (sample %d); stopped it there",
                request_id, worker_id, self.cap, index,
            )
        return taken, over
