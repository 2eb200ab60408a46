"""``Generation.deltas(texts=True)``: texts of tokens that arrived together come as one batch, handed
over before the generation waits for the worker (never held back for more)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest

from gateway.pipeline.generation import Generation, SampleDelta
from gateway.pipeline.observer import NULL_OBSERVER, PipelineObserver
from gateway.tokenization import StopPlan, Tokenizer
from tests.pipeline.test_resume import FakeWorker, chunk, complete, prepare
from tests.tokenization.helpers import qwen_files


@pytest.fixture(scope="module")
def tok() -> Tokenizer:
    return Tokenizer.from_path(qwen_files(), name="Qwen/Qwen3-0.6B")


@dataclass
class Arrivals:
    """Messages that arrive in groups: a group is ``ready`` once released, and a read past
    it waits for the next release (as a socket read would)."""

    groups: list[list[Any]]
    worker: FakeWorker = field(default_factory=lambda: FakeWorker("w1"))
    observer: PipelineObserver = NULL_OBSERVER
    closed: bool = False
    waits: int = 0  # reads that found nothing there and had to wait
    outputs: list[list[int]] = field(default_factory=list)  # what the policy was told the worker learned
    _here: list[Any] = field(default_factory=list)
    _released: asyncio.Event = field(default_factory=asyncio.Event)

    def release(self) -> None:
        self._here.extend(self.groups.pop(0))
        self._released.set()

    def ready(self) -> bool:
        return bool(self._here)

    async def read(self) -> Any:
        if not self._here:
            self.waits += 1
            self._released.clear()
            await self._released.wait()
        return self._here.pop(0)

    def finished(self) -> None:
        self.closed = True

    def output(self, output_ids: Sequence[int]) -> None:
        self.outputs.append(list(output_ids))

    async def abort(self, reason: str = "") -> None:
        self.closed = True

    async def aclose(self) -> None:
        self.closed = True


@dataclass
class TakenTogether(Arrivals):
    """``Arrivals`` whose arrived messages are taken in one call (``WorkerStream.read_arrived``),
    as the gateway's own worker calls give them."""

    taken: list[int] = field(default_factory=list)  # how many each call took

    def read_arrived(self) -> list[Any]:
        here, self._here = self._here, []
        if here:
            self.taken.append(len(here))
        return here


STREAMS = pytest.mark.parametrize("make", [Arrivals, TakenTogether], ids=["one-by-one", "taken-together"])


@STREAMS
async def test_tokens_that_arrived_together_come_as_one_batch_before_the_wait(tok: Tokenizer, make: type[Arrivals]) -> None:
    ids = tok.encode(" one two three four five six", False)
    assert len(ids) == 6
    stream = make([[chunk([i]) for i in ids[:4]], [chunk([i]) for i in ids[4:]], [complete()]])
    gen = Generation(stream, prepare(tok, [1, 2], max_new_tokens=6))  # type: ignore[arg-type]
    assert gen.plain
    pieces = gen.deltas(texts=True)
    stream.release()
    first = await pieces.__anext__()
    # All four texts, handed over before the read that has to wait for the next group.
    assert first == [" one", " two", " three", " four"]
    assert stream.waits == 0
    stream.release()
    assert await pieces.__anext__() == [" five", " six"]
    stream.release()
    last = [d async for d in pieces]
    assert len(last) == 1 and isinstance(last[0], SampleDelta) and last[0].finish_reason == "length"
    assert stream.closed
    assert stream.outputs == [ids]  # the one sample's output went to the policy through its stream
    if isinstance(stream, TakenTogether):
        # The first group in one call; of a group that wakes a waiting read, the rest in one.
        assert stream.taken == [4, 1]


async def test_one_token_at_a_time_comes_one_text_at_a_time(tok: Tokenizer) -> None:
    ids = tok.encode(" one two three", False)
    stream = Arrivals([[chunk([i])] for i in ids] + [[complete()]])
    gen = Generation(stream, prepare(tok, [1, 2], max_new_tokens=3))  # type: ignore[arg-type]
    pieces = gen.deltas(texts=True)
    got: list[Any] = []
    for _ in range(3):
        stream.release()
        got.append(await pieces.__anext__())
    assert got == [[" one"], [" two"], [" three"]]


@STREAMS
async def test_a_delta_says_where_its_tokens_begin_in_the_output(tok: Tokenizer, make: type[Arrivals]) -> None:
    ids = tok.encode(" one two three four five", False)
    stream = make([[chunk([ids[0]]), chunk([ids[1]]), chunk(ids[2:4]), chunk([ids[4]]), complete()]])
    gen = Generation(stream, prepare(tok, [1, 2], max_new_tokens=5))  # type: ignore[arg-type]
    stream.release()
    out = [d async for d in gen.deltas(texts=True)]
    assert out[0] == [" one", " two"]
    several, last = out[1], out[3]
    assert isinstance(several, SampleDelta) and several.token_ids == ids[2:4] and several.at == 2
    assert out[2] == [" five"]
    assert isinstance(last, SampleDelta) and last.finish_reason == "length" and last.at == 5  # after every token
    assert gen.output_ids(0) == ids


@STREAMS
async def test_a_token_stop_in_a_batch_hands_over_the_texts_before_it(tok: Tokenizer, make: type[Arrivals]) -> None:
    ids = tok.encode(" one two three four", False)
    stop = ids[2]
    stream = make([[chunk([i]) for i in ids]])
    prepared = prepare(tok, [1, 2], max_new_tokens=8)
    prepared.stop_plan = StopPlan.build(tok, stop_token_ids=[stop], ignore_eos=True)
    gen = Generation(stream, prepared)  # type: ignore[arg-type]
    assert gen.plain
    stream.release()
    out = [d async for d in gen.deltas(texts=True)]
    assert out[0] == [" one", " two"]
    assert isinstance(out[1], SampleDelta) and out[1].finish_reason == "stop" and out[1].text == ""
    assert len(out) == 2  # nothing after the stop
    assert stream.closed


async def test_completion_tokens_count_through_a_text_stop_not_past_it(tok: Tokenizer) -> None:
    """A worker chunk can carry tokens past the one that completed a stop string; the
    usage counts through that token, as SGLang's completion_tokens does."""
    ids = tok.encode(" one two three four five", False)
    stream = Arrivals([[chunk(ids), complete()]])
    gen = Generation(stream, prepare(tok, [1, 2], max_new_tokens=8, stop=(" two",)))  # type: ignore[arg-type]
    stream.release()
    out = [d async for d in gen.deltas()]
    assert "".join(d.text for d in out) == " one"
    assert out[-1].finish_reason == "stop" and out[-1].matched_stop == " two"
    assert gen.usage.completion_tokens == 2


async def test_completion_tokens_count_a_token_stop_itself(tok: Tokenizer) -> None:
    ids = tok.encode(" one two three four", False)
    stream = Arrivals([[chunk(ids), complete()]])
    prepared = prepare(tok, [1, 2], max_new_tokens=8)
    prepared.stop_plan = StopPlan.build(tok, stop_token_ids=[ids[1]], ignore_eos=True)
    gen = Generation(stream, prepared)  # type: ignore[arg-type]
    stream.release()
    out = [d async for d in gen.deltas()]
    assert "".join(d.text for d in out) == " one" and out[-1].matched_stop == ids[1]
    assert gen.usage.completion_tokens == 2


def _with_logprobs(ids: Sequence[int]) -> Any:

    message = chunk(ids)
    lp = message.chunk.output_logprobs
    lp.token_logprobs.extend([-0.5 - i for i in range(len(ids))])
    lp.token_ids.extend(ids)
    for i, t in enumerate(ids):
        lp.top_logprobs.add(values=[-0.5 - i], token_ids=[t])
    return message


@pytest.mark.parametrize("want", [True, False])
async def test_a_token_stops_logprob_is_the_last_entry_as_sglang_reports_it(tok: Tokenizer, want: bool) -> None:
    ids = tok.encode(" one two three four", False)
    stream = Arrivals([[_with_logprobs(ids), complete()]])
    prepared = prepare(tok, [1, 2], max_new_tokens=8, logprobs=want, top_logprobs=1 if want else 0)
    prepared.stop_plan = StopPlan.build(tok, stop_token_ids=[ids[1]], ignore_eos=True)
    gen = Generation(stream, prepared)  # type: ignore[arg-type]
    stream.release()
    out = [d async for d in gen.deltas()]
    last = out[-1]
    assert "".join(d.text for d in out) == " one" and last.matched_stop == ids[1]
    assert [t for d in out for t in d.token_ids] == ids[:1]  # the stop token's text is trimmed
    if want:
        assert last.stop_token == ids[1] and last.logprob_ids == ids[:2]
        assert last.logprobs == [-0.5, -1.5] and last.top_logprobs == [[(ids[0], -0.5)], [(ids[1], -1.5)]]
    else:
        assert last.stop_token is None and last.logprobs is None and last.logprob_ids == last.token_ids
    assert gen.usage.completion_tokens == 2


async def test_a_text_stop_carries_no_extra_logprob(tok: Tokenizer) -> None:
    ids = tok.encode(" one two three four", False)
    stream = Arrivals([[_with_logprobs(ids), complete()]])
    prepared = prepare(tok, [1, 2], max_new_tokens=8, logprobs=True, stop=["two"])
    gen = Generation(stream, prepared)  # type: ignore[arg-type]
    stream.release()
    out = [d async for d in gen.deltas()]
    assert out[-1].stop_token is None
    assert sum(len(d.logprobs or []) for d in out) == sum(len(d.token_ids) for d in out)


async def test_a_stop_token_only_in_the_complete_still_gets_its_logprob_row(tok: Tokenizer) -> None:
    from gateway.proto import sglang_scheduler_pb2 as pb

    ids = tok.encode(" one two", False)
    done = pb.GenerateResponse(complete=pb.GenerateComplete(finish_reason="stop", matched_token_id=ids[1], output_ids=[ids[1]]))
    done.complete.output_logprobs.token_logprobs.append(-1.25)
    done.complete.output_logprobs.token_ids.append(ids[1])
    done.complete.output_logprobs.top_logprobs.add(values=[-1.25], token_ids=[ids[1]])
    stream = Arrivals([[_with_logprobs(ids[:1]), done]])
    prepared = prepare(tok, [1, 2], max_new_tokens=8, logprobs=True, top_logprobs=1)
    prepared.stop_plan = StopPlan.build(tok, stop_token_ids=[ids[1]], ignore_eos=True)
    gen = Generation(stream, prepared)  # type: ignore[arg-type]
    stream.release()
    out = [d async for d in gen.deltas()]
    assert "".join(d.text for d in out) == " one"
    assert [v for d in out for v in d.logprobs or []] == [-0.5, -1.25]
    assert out[-1].stop_token == ids[1] and out[-1].logprob_ids == [ids[1]]
    assert out[-1].top_logprobs == [[(ids[1], -1.25)]]


async def test_whole_answers_all_sent_with_index_0_fill_the_samples_in_order(tok: Tokenizer) -> None:
    """SGLang's servicer sets a complete's index on its streamed path only: unstreamed, every
    sample comes back with index 0. Each complete is a whole sample; they fill the samples
    in the order they arrive."""
    from gateway.proto import sglang_scheduler_pb2 as pb

    a, b = tok.encode(" one two", False), tok.encode(" three four", False)
    answers = [pb.GenerateResponse(complete=pb.GenerateComplete(index=0, finish_reason="length", output_ids=ids))
               for ids in (a, b)]
    stream = Arrivals([answers])
    prepared = prepare(tok, [1, 2], max_new_tokens=2, n=2)
    prepared.stream = False
    gen = Generation(stream, prepared)  # type: ignore[arg-type]
    stream.release()
    out = [d async for d in gen.deltas()]
    texts = {i: "".join(d.text for d in out if d.index == i) for i in (0, 1)}
    assert texts == {0: " one two", 1: " three four"}
    assert sorted(d.index for d in out if d.finish_reason == "length") == [0, 1]
    assert gen.usage.completion_tokens == 4


async def test_a_streamed_samples_repeated_complete_is_not_taken_for_another_sample(tok: Tokenizer) -> None:
    """Once any chunk came the indexes are the worker's own: a complete naming a finished
    sample is dropped, and a sample that never finished is the worker's fault."""
    from gateway.protocol.errors import GatewayError

    ids = tok.encode(" one two", False)
    stream = Arrivals([[chunk(ids, index=0), complete(index=0), complete(index=0), None]])  # None: the stream's end
    prepared = prepare(tok, [1, 2], max_new_tokens=2, n=2)
    gen = Generation(stream, prepared)  # type: ignore[arg-type]
    stream.release()
    with pytest.raises(GatewayError):
        _ = [d async for d in gen.deltas()]


@dataclass
class Pushing(Arrivals):
    """Arrivals whose deliveries go first to a listening target while a read waits, as
    ``WorkerStream.listen`` hands them over from the connection's read callback."""

    target: Any = None
    reading: bool = False

    def listen(self, target: Any) -> bool:
        self.target = target
        return True

    def release(self) -> None:
        group = self.groups.pop(0)
        if self.target is not None and self.reading:
            took = False
            while group and self.target.offer(group[0]):
                group.pop(0)
                took = True
            if took:
                self.target.flush()
        if group:
            self._here.extend(group)
            self._released.set()

    async def read(self) -> Any:
        self.reading = True
        try:
            return await super().read()
        finally:
            self.reading = False


@dataclass
class Sink:
    ok: bool = True
    written: list[list[str]] = field(default_factory=list)

    def ready(self) -> bool:
        return self.ok

    def write(self, texts: list[str]) -> None:
        self.written.append(list(texts))


async def test_pushed_texts_go_to_the_sink_as_they_arrive_and_the_rest_comes_through_deltas(tok: Tokenizer) -> None:
    ids = tok.encode(" one two three four five six", False)
    stream = Pushing([[chunk([i]) for i in ids[:2]], [chunk([i]) for i in ids[2:5]], [chunk([ids[5]]), complete()]])
    gen = Generation(stream, prepare(tok, [1, 2], max_new_tokens=6))  # type: ignore[arg-type]
    pieces = gen.deltas(texts=True)
    stream.release()
    assert await pieces.__anext__() == [" one", " two"]  # before the sink: the consumer's way
    sink = Sink()
    assert gen.push_to(sink) and stream.target is gen
    rest = asyncio.ensure_future(pieces.__anext__())
    await asyncio.sleep(0)
    stream.release()
    await asyncio.sleep(0)
    # One write per delivery, and the consumer was not woken for it.
    assert sink.written == [[" three", " four", " five"]] and not rest.done()
    stream.release()  # the last token is pushed; the complete wakes the consumer, after it
    last = await rest
    assert sink.written == [[" three", " four", " five"], [" six"]]
    assert isinstance(last, SampleDelta) and last.finish_reason == "length" and last.text == ""
    assert [d async for d in pieces] == []
    assert gen.output_ids(0) == ids and gen.usage.per_sample_completion == {0: 6}
    assert stream.outputs == [ids] and stream.target is None  # let go at the end


async def test_a_sink_that_cannot_write_now_leaves_the_texts_to_the_consumer(tok: Tokenizer) -> None:
    ids = tok.encode(" one two three", False)
    stream = Pushing([[chunk([ids[0]])], [chunk([i]) for i in ids[1:]], [complete()]])
    gen = Generation(stream, prepare(tok, [1, 2], max_new_tokens=3))  # type: ignore[arg-type]
    pieces = gen.deltas(texts=True)
    stream.release()
    assert await pieces.__anext__() == [" one"]
    sink = Sink(ok=False)  # a paused connection: the consumer's own send waits for the drain
    assert gen.push_to(sink)
    rest = asyncio.ensure_future(pieces.__anext__())
    await asyncio.sleep(0)
    stream.release()
    assert await rest == [" two", " three"] and sink.written == []


async def test_only_the_text_path_pushes(tok: Tokenizer) -> None:
    stream = Pushing([[chunk([5])], [complete()]])
    gen = Generation(stream, prepare(tok, [1, 2], max_new_tokens=3))  # type: ignore[arg-type]
    gen.deltas()
    assert not gen.push_to(Sink()) and stream.target is None


async def test_tokens_taken_together_give_what_one_by_one_gives(tok: Tokenizer) -> None:
    """Multi-byte characters cut between tokens, counts that grow, a complete after the last
    token: the same texts, usage, output and per-token gaps (one each after the first)
    whether the arrived messages are read one by one or taken in one call."""
    text = " Grüße, 世界! 👩‍👩‍👧‍👦 naïve café"
    ids = tok.encode(text, False)
    gaps: dict[str, list[float]] = {}

    class Gaps(PipelineObserver):
        def __init__(self, name: str) -> None:
            self.name = name

        def generation_timing(self, model: str, worker_id: str, **kw: Any) -> None:
            gaps[self.name] = kw["token_gaps"]

    async def run(make: type[Arrivals]) -> tuple[list[Any], Any, list[int]]:
        msgs = [chunk([t], prompt_tokens=2, cached=min(i, 1)) for i, t in enumerate(ids)] + [complete(prompt_tokens=2)]
        stream = make([msgs[:5], msgs[5:]], observer=Gaps(make.__name__))
        gen = Generation(stream, prepare(tok, [1, 2], max_new_tokens=len(ids)))  # type: ignore[arg-type]
        pieces = gen.deltas(texts=True)
        out: list[Any] = []
        stream.release()
        out.append(await pieces.__anext__())
        stream.release()
        out += [d async for d in pieces]
        return out, gen.usage, gen.output_ids(0)

    one, usage_one, ids_one = await run(Arrivals)
    together, usage_together, ids_together = await run(TakenTogether)
    texts = lambda out: "".join("".join(d) if type(d) is list else d.text for d in out)  # noqa: E731
    assert texts(one) == texts(together) == text
    assert one[0] == together[0]  # the first group's texts, held back where a character is cut alike
    assert usage_one == usage_together and usage_together.cached_tokens == 1 and usage_together.prompt_tokens == 2
    assert ids_one == ids_together == ids
    assert len(gaps["Arrivals"]) == len(gaps["TakenTogether"]) == len(ids) - 1
