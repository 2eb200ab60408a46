"""The journal as a generation's first stream: the journaled tokens as one chunk, then
a worker failure, so the generation resumes (the resume path's own tests run it on)."""

from __future__ import annotations

import pytest

from gateway.pipeline.journal_stream import JOURNAL_ID, JournalStream
from gateway.pipeline.observer import NULL_OBSERVER
from gateway.protocol.errors import WorkerError


async def test_replays_then_breaks() -> None:
    stream = JournalStream([5, 6, 7], prompt_tokens=40, observer=NULL_OBSERVER)
    assert stream.worker.id == JOURNAL_ID and stream.ready() and not stream.closed
    msg = await stream.read()
    assert msg is not None and msg.WhichOneof("response") == "chunk"
    chunk = msg.chunk
    assert (list(chunk.token_ids), chunk.prompt_tokens, chunk.completion_tokens, chunk.index) == ([5, 6, 7], 40, 3, 0)
    assert not stream.ready()
    with pytest.raises(WorkerError, match="journal"):
        await stream.read()
    await stream.abort("resuming elsewhere")
    assert stream.closed
