"""A worker's output is capped at what the request asked for, and its ids must be in the
vocabulary: streamed and whole, one sample and several, the fast one-token path and
the general one."""

from __future__ import annotations

import logging

import pytest

from gateway.pipeline.generation import Generation, SampleDelta
from gateway.pipeline.output_guard import OUTPUT_CEILING, OutputGuard
from gateway.proto import sglang_scheduler_pb2 as pb
from gateway.protocol.errors import WorkerError
from gateway.tokenization import Tokenizer
from tests.pipeline.test_resume import FakeStream, FakeWorker, chunk, collect, complete, prepare
from tests.tokenization.helpers import qwen_files


@pytest.fixture(scope="module")
def tok() -> Tokenizer:
    return Tokenizer.from_path(qwen_files(), name="Qwen/Qwen3-0.6B")


def _endless(ids: list[int], count: int) -> list[pb.GenerateResponse]:
    """A worker that never says it is done: ``count`` one-token chunks, no complete."""
    return [chunk([ids[i % len(ids)]]) for i in range(count)]


@pytest.mark.parametrize("fast", [True, False])
async def test_a_stream_past_max_tokens_ends_at_the_cap_with_length(tok: Tokenizer, fast: bool, caplog: pytest.LogCaptureFixture) -> None:
    ids = tok.encode(" one two three", False)
    stream = FakeStream(FakeWorker("w1"), _endless(ids, 500))
    gen = Generation(stream, prepare(tok, [1, 2], max_new_tokens=16))  # type: ignore[arg-type]
    with caplog.at_level(logging.WARNING, logger="gateway.pipeline.output_guard"):
        if fast:
            assert gen.plain
            out = [d async for d in gen.deltas(texts=True)]
            deltas = [d for d in out if isinstance(d, SampleDelta)]
            texts = [t for d in out if isinstance(d, list) for t in d]
        else:
            deltas = await collect(gen)
            texts = [d.text for d in deltas]
    assert deltas[-1].finish_reason == "length"
    assert gen.usage.per_sample_completion[0] == 16
    assert len(gen.output_ids(0)) == 16
    assert "".join(texts).count(" one") == 6  # 16 tokens of a 3-word cycle
    assert stream.aborted  # the worker was told to stop
    assert len(stream.script) == 500 - 17  # reading stopped at the first token past the cap
    assert len(caplog.records) == 1 and "more than the 16 tokens" in caplog.records[0].getMessage()


async def test_a_whole_answer_past_max_tokens_is_cut_at_the_cap(tok: Tokenizer) -> None:
    many = pb.GenerateResponse(complete=pb.GenerateComplete(output_ids=[100] * 300_000, finish_reason="length"))
    stream = FakeStream(FakeWorker("w1"), [many])
    prepared = prepare(tok, [1, 2], max_new_tokens=40)
    prepared.stream = False
    deltas = await collect(Generation(stream, prepared))  # type: ignore[arg-type]
    assert sum(len(d.token_ids) for d in deltas) == 40
    assert deltas[-1].finish_reason == "length"


async def test_each_sample_has_its_own_cap(tok: Tokenizer) -> None:
    script = [chunk([100, 101, 102], index=0), chunk([100] * 10, index=1), chunk([100, 101], index=0)]
    stream = FakeStream(FakeWorker("w1"), script)
    gen = Generation(stream, prepare(tok, [1, 2], max_new_tokens=4, n=2))  # type: ignore[arg-type]
    deltas = await collect(gen)
    assert gen.usage.per_sample_completion == {0: 4, 1: 4}
    assert {d.index for d in deltas if d.finish_reason == "length"} == {0, 1}


@pytest.mark.parametrize("bad", [2**32 - 1, 10**9, 151_700])
@pytest.mark.parametrize("fast", [True, False])
async def test_an_id_outside_the_vocabulary_is_a_worker_error(
    tok: Tokenizer, bad: int, fast: bool, caplog: pytest.LogCaptureFixture
) -> None:
    stream = FakeStream(FakeWorker("w1"), [chunk([100]), chunk([bad]), chunk([101]), complete()])
    gen = Generation(stream, prepare(tok, [1, 2], max_new_tokens=8))  # type: ignore[arg-type]
    with caplog.at_level(logging.WARNING, logger="gateway.pipeline.output_guard"), pytest.raises(WorkerError) as err:
        async for _ in gen.deltas(texts=fast):
            pass
    assert str(bad) in err.value.message and "vocabulary" in err.value.message
    assert err.value.status == 502
    assert stream.aborted
    assert len(caplog.records) == 1


async def test_an_id_outside_the_vocabulary_in_a_whole_answer(tok: Tokenizer) -> None:
    done = pb.GenerateResponse(complete=pb.GenerateComplete(output_ids=[100, 151_700], finish_reason="stop"))
    gen = Generation(FakeStream(FakeWorker("w1"), [done]), prepare(tok, [1, 2], max_new_tokens=8))  # type: ignore[arg-type]
    with pytest.raises(WorkerError):
        await collect(gen)


async def test_an_honest_worker_at_exactly_the_cap_is_untouched(tok: Tokenizer, caplog: pytest.LogCaptureFixture) -> None:
    ids = tok.encode(" a b c d", False)
    stream = FakeStream(FakeWorker("w1"), [chunk([i]) for i in ids] + [complete(reason="length")])
    with caplog.at_level(logging.WARNING, logger="gateway.pipeline.output_guard"):
        deltas = await collect(Generation(stream, prepare(tok, [1, 2], max_new_tokens=4)))  # type: ignore[arg-type]
    assert "".join(d.text for d in deltas) == " a b c d"
    assert deltas[-1].finish_reason == "length"
    assert not stream.aborted and not caplog.records


def test_the_cap_without_max_tokens_is_the_context_room_or_the_ceiling(tok: Tokenizer) -> None:
    prepared = prepare(tok, [1, 2], max_new_tokens=None)
    assert OutputGuard.for_request(prepared).cap == OUTPUT_CEILING
    prepared.output_room = 500
    assert OutputGuard.for_request(prepared).cap == 500
    assert OutputGuard.for_request(prepared).vocab == tok.vocab_size
