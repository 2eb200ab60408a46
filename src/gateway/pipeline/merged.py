"""Several one-sample worker streams read as one stream of ``n`` samples.

A PD request with ``n > 1`` sends one decode request per sample, and a resumed
request continues each unfinished sample as its own request; both then read the
parts as one stream, whichever part has a message first. This base owns the
reading and the endings (finish, abort, the reads still pending), so there is
one copy of it; subclasses only rewrite each message for the sample it belongs to.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from gateway.pipeline.settle import settle
from gateway.proto import sglang_scheduler_pb2 as pb


class MergedStreams:
    """The parts' reads and endings; ``closed`` once finished or aborted."""

    def __init__(self, streams: Sequence[Any]) -> None:
        self._streams = list(streams)
        self._live = set(range(len(self._streams)))
        self._reads: dict[int, asyncio.Future[pb.GenerateResponse | None]] = {}
        self.closed = False

    async def _next(self) -> tuple[int, pb.GenerateResponse | None]:
        """(part, its next message or None at its end) for the first live part to answer.
        A worker error propagates to the caller; call only while ``_live`` is not empty."""
        if len(self._live) == 1 and not self._reads:  # one part left: no task per message
            i = next(iter(self._live))
            return i, await self._streams[i].read()
        for k in self._live:
            if k not in self._reads:
                self._reads[k] = asyncio.ensure_future(self._streams[k].read())
        done, _ = await asyncio.wait(self._reads.values(), return_when=asyncio.FIRST_COMPLETED)
        task = next(iter(done))
        i = next(k for k, t in self._reads.items() if t is task)
        del self._reads[i]
        error = None if task.cancelled() else task.exception()
        if error is None:
            return i, task.result()
        del done, task  # raised from a frame that held the task, the error would hold itself (``settle``)
        try:
            raise error
        finally:
            del error

    def ready(self) -> bool:
        """Whether a read would not wait is not tracked across parts: never claimed."""
        return False

    def _part_done(self, i: int) -> None:
        """Part ``i`` sent its complete: free its slot without an Abort."""
        self._live.discard(i)
        self._streams[i].finished()

    async def _cancel_reads(self) -> None:
        reads = list(self._reads.values())
        self._reads.clear()
        for task in reads:
            task.cancel()
        await settle(reads)

    def finished(self) -> None:
        """Every sample completed: free whatever is still held, without an Abort."""
        for task in self._reads.values():
            task.cancel()
        self._reads.clear()
        for s in self._streams:
            s.finished()
        self.closed = True

    async def abort(self, reason: str = "client gone") -> None:
        """Stop every part's work now and free their slots."""
        await self._cancel_reads()
        for s in self._streams:
            await s.abort(reason)
        self.closed = True

    def output(self, output_ids: Sequence[int]) -> None:
        """Parts on several workers: no one worker holds the whole output to learn."""
        return None

    async def aclose(self) -> None:
        await self.abort("finished by gateway")
