"""A generation's first stream read back from a journal, for continuing it elsewhere.

When the process running a background response dies, another process continues it:
the tokens the dead one journaled are handed to a fresh ``Generation`` as if a worker
had sent them (one chunk), and then the stream "fails", so the ``Generation`` resumes
through its one resume path (``pipeline.resume``): a continuation with the prompt
plus those tokens and the rest of the budget, on a worker the policy picks. The
detokenizer, stop matcher, parsers and usage see the whole output, as after any
resumed worker failure.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast

from gateway.pipeline.observer import PipelineObserver
from gateway.proto import sglang_scheduler_pb2 as pb
from gateway.protocol.errors import WorkerError
from gateway.workers.worker import Worker

JOURNAL_ID = "journal"


class _Origin:
    """Stands where a stream's worker is: a ``Generation`` reads only its id (logs, and
    the resumer's set of failed workers, which a journal never joins for real)."""

    id = JOURNAL_ID


class JournalStream:
    """A ``TokenStream`` that replays ``generated`` as one chunk, then breaks."""

    def __init__(self, generated: Sequence[int], prompt_tokens: int, observer: PipelineObserver) -> None:
        self._generated = list(generated)
        self._prompt_tokens = prompt_tokens
        self._observer = observer
        self._sent = False
        self._closed = False

    @property
    def worker(self) -> Worker:
        return cast(Worker, _Origin())

    @property
    def observer(self) -> PipelineObserver:
        return self._observer

    @property
    def closed(self) -> bool:
        return self._closed

    async def abort(self, reason: str = "") -> None:
        self._closed = True

    async def read(self) -> pb.GenerateResponse | None:
        if not self._sent:
            self._sent = True
            chunk = pb.GenerateStreamChunk(
                token_ids=self._generated, prompt_tokens=self._prompt_tokens,
                completion_tokens=len(self._generated), index=0,
            )
            return pb.GenerateResponse(chunk=chunk)
        raise WorkerError("the process that ran this generation stopped; continuing it from its journal")

    def ready(self) -> bool:
        return not self._sent

    def finished(self) -> None:
        self._closed = True

    def output(self, output_ids: Sequence[int]) -> None:
        """A journal caches nothing: no policy learns from it."""

    async def aclose(self) -> None:
        self._closed = True
