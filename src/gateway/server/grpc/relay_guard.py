"""The SGLang pass-through's output guard: a worker's messages are relayed as they come,
but no sample gets more tokens than the request asked for, and no id outside the
vocabulary gets through (the same rules as ``pipeline.output_guard`` on the other paths).

A chunk that passes a sample's cap is cut at it and followed by a GenerateComplete with
``finish_reason`` "length", as a worker that stopped there would have sent; once every
sample is done the caller stops the worker. A message's output logprobs (one entry per
token) are cut with its tokens, and never relayed for more tokens than it carries.
"""

from __future__ import annotations

import logging

from gateway.proto import sglang_scheduler_pb2 as pb
from gateway.protocol.errors import WorkerError

log = logging.getLogger(__name__)


class RelayGuard:
    def __init__(self, cap: int, vocab: int, samples: int, *, request_id: str, worker_id: str) -> None:
        self.cap = cap
        self.vocab = vocab
        self._counts = [0] * max(1, samples)
        self._open = max(1, samples)
        self._request_id = request_id
        self._worker_id = worker_id
        self.cut = False  # a sample was ended here, before its worker said so

    @property
    def stop_worker(self) -> bool:
        """Every sample has ended and at least one was cut here: the worker must be stopped
        (it would go on past what was asked)."""
        return self._open == 0 and self.cut

    def check(self, message: pb.GenerateResponse) -> list[pb.GenerateResponse]:
        """The messages to relay for ``message`` (itself, cut, or nothing)."""
        which = message.WhichOneof("response")
        if which == "chunk":
            ids = message.chunk.token_ids
            index = message.chunk.index
        elif which == "complete":
            ids = message.complete.output_ids
            index = message.complete.index
        else:
            return [message]
        if not 0 <= index < len(self._counts):
            raise WorkerError(f"worker {self._worker_id} answered for sample {index}, not asked for")
        if self._counts[index] < 0:
            return []  # this sample already ended here
        if ids and max(ids) >= self.vocab:
            bad = next(t for t in ids if t >= self.vocab)
            log.warning("request %s: worker %s sent token id %d outside the vocabulary [0, %d); request failed",
                        self._request_id, self._worker_id, bad, self.vocab)
            raise WorkerError(f"worker {self._worker_id} sent token id {bad}, outside the model's vocabulary [0, {self.vocab})")
        if which == "complete":
            done = message.complete
            if len(ids) > self.cap:
                del done.output_ids[self.cap:]
                done.finish_reason = "length"
                done.completion_tokens = self.cap
            if done.HasField("output_logprobs"):
                _keep_logprobs(done.output_logprobs, len(done.output_ids))
            del done.all_hidden_states[len(done.output_ids):]
            self._end(index)
            return [message]
        room = self.cap - self._counts[index]
        if len(ids) <= room:
            self._counts[index] += len(ids)
            if message.chunk.HasField("output_logprobs"):
                _keep_logprobs(message.chunk.output_logprobs, len(ids))
            return [message]
        log.warning("request %s: worker %s sent more than the %d tokens asked for (sample %d); stopped it there",
                    self._request_id, self._worker_id, self.cap, index)
        self.cut = True
        del message.chunk.token_ids[room:]
        if message.chunk.HasField("output_logprobs"):
            _keep_logprobs(message.chunk.output_logprobs, room)
        del message.chunk.hidden_states[:]  # per-token vectors, flattened: not cuttable (and never asked for)
        message.chunk.completion_tokens = self.cap
        end = pb.GenerateResponse(request_id=message.request_id, complete=pb.GenerateComplete(
            index=index, finish_reason="length", prompt_tokens=message.chunk.prompt_tokens,
            completion_tokens=self.cap, cached_tokens=message.chunk.cached_tokens,
        ))
        self._end(index)
        return [message, end] if room > 0 else [end]

    def _end(self, index: int) -> None:
        if self._counts[index] >= 0:
            self._counts[index] = -1
            self._open -= 1


def _keep_logprobs(lp: pb.OutputLogProbs, n: int) -> None:
    """Keep the entries of the first ``n`` tokens (each list has one per token)."""
    if len(lp.token_logprobs) > n or len(lp.token_ids) > n or len(lp.top_logprobs) > n or len(lp.token_ids_logprobs) > n:
        del lp.token_logprobs[n:]
        del lp.token_ids[n:]
        del lp.top_logprobs[n:]
        del lp.token_ids_logprobs[n:]
