"""Resuming a broken generation, against fake worker streams: the continuation's
request, carried-over text/stop/usage state, n>1 multiplexing, refusals."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest

from gateway.pipeline.generation import Generation, SampleDelta
from gateway.pipeline.observer import NULL_OBSERVER, PipelineObserver
from gateway.pipeline.prepared import PreparedRequest
from gateway.pipeline.resume import ResumeConfig, Resumer, continuation_request, not_resumable
from gateway.pipeline.sampling import to_sampling_params
from gateway.proto import sglang_scheduler_pb2 as pb
from gateway.protocol.errors import GatewayError, InvalidRequestError, WorkerError
from gateway.protocol.sampling import Constraint, SamplingOptions
from gateway.tokenization import StopPlan, Tokenizer
from tests.tokenization.helpers import qwen_files


@pytest.fixture(scope="module")
def tok() -> Tokenizer:
    return Tokenizer.from_path(qwen_files(), name="Qwen/Qwen3-0.6B")


@dataclass
class FakeWorker:
    id: str


@dataclass
class FakeStream:
    """Scripted messages; an Exception in the script is raised at that point. ``together``:
    the whole script has arrived (``ready`` while it lasts), else one message at a time."""

    worker: FakeWorker
    script: list[Any]
    observer: PipelineObserver = NULL_OBSERVER
    closed: bool = False
    aborted: list[str] = field(default_factory=list)
    together: bool = False
    outputs: list[list[int]] = field(default_factory=list)  # what the policy was told the worker learned

    def ready(self) -> bool:
        return self.together and bool(self.script)

    async def read(self) -> pb.GenerateResponse | None:
        if not self.script:
            return None
        item = self.script.pop(0)
        if isinstance(item, Exception):
            self.closed = True
            raise item
        return item  # type: ignore[no-any-return]

    def finished(self) -> None:
        self.closed = True

    def output(self, output_ids: Sequence[int]) -> None:
        self.outputs.append(list(output_ids))

    async def abort(self, reason: str = "") -> None:
        if not self.closed:
            self.aborted.append(reason)
        self.closed = True

    async def aclose(self) -> None:
        await self.abort("finished by gateway")


def chunk(ids: Sequence[int], index: int = 0, prompt_tokens: int = 0, cached: int = 0) -> pb.GenerateResponse:
    return pb.GenerateResponse(chunk=pb.GenerateStreamChunk(token_ids=list(ids), index=index, prompt_tokens=prompt_tokens, cached_tokens=cached))


def complete(index: int = 0, reason: str = "length", prompt_tokens: int = 0) -> pb.GenerateResponse:
    return pb.GenerateResponse(complete=pb.GenerateComplete(index=index, finish_reason=reason, prompt_tokens=prompt_tokens))


def prepare(tok: Tokenizer, prompt: list[int], **sampling: Any) -> PreparedRequest:
    options = SamplingOptions(**{"max_new_tokens": 8, "ignore_eos": True, **sampling})
    plan = StopPlan.build(tok, stop=list(options.stop), ignore_eos=options.ignore_eos)
    return PreparedRequest("rid", "m", prompt, options, plan, tok, stream=True)


def base_request(prepared: PreparedRequest) -> pb.GenerateRequest:
    s = prepared.sampling
    return pb.GenerateRequest(
        request_id=prepared.request_id, tokenized=pb.TokenizedInput(input_ids=prepared.prompt_ids, original_text="hi"),
        sampling_params=to_sampling_params(s, stop_token_ids=prepared.stop_plan.stop_token_ids, max_new_tokens=s.max_new_tokens),
        stream=True, logprob_start_len=0,
    )


class Opener:
    """The engine's open path, faked: hands out scripted streams and records requests."""

    def __init__(self, scripts: list[tuple[str, list[Any]]]) -> None:
        self.scripts = scripts
        self.requests: list[tuple[pb.GenerateRequest, frozenset[str]]] = []
        self.streams: list[FakeStream] = []

    async def __call__(self, request: pb.GenerateRequest, avoid: frozenset[str]) -> FakeStream:
        self.requests.append((request, avoid))
        worker, script = self.scripts.pop(0)
        if isinstance(script, Exception):
            raise script
        stream = FakeStream(FakeWorker(worker), script)
        self.streams.append(stream)
        return stream


class Recorder(PipelineObserver):
    def __init__(self) -> None:
        self.resumes: list[tuple[str, str]] = []

    def resumed(self, worker_id: str, outcome: str) -> None:
        self.resumes.append((worker_id, outcome))


async def collect(gen: Generation) -> list[SampleDelta]:
    return [d async for d in gen.deltas()]


def words(tok: Tokenizer, text: str) -> list[int]:
    return tok.encode(text, False)


async def test_single_sample_resumes_with_prompt_plus_generated(tok: Tokenizer) -> None:
    prompt = words(tok, "Count:")
    out = words(tok, " one two three four five six seven eight")[:8]
    prepared = prepare(tok, prompt)
    first = FakeStream(FakeWorker("w1"), [chunk(out[:3], prompt_tokens=len(prompt), cached=1), WorkerError("w1 died")])
    opener = Opener([("w2", [chunk(out[3:8], prompt_tokens=99, cached=50), complete(reason="length", prompt_tokens=99)])])
    obs = Recorder()
    gen = Generation(first, prepared, Resumer(base_request(prepared), opener, ResumeConfig(), prepared.sampling, obs))
    deltas = await collect(gen)
    assert "".join(d.text for d in deltas) == tok.decode(out)
    assert [t for d in deltas for t in d.token_ids] == out
    assert deltas[-1].finish_reason == "length"
    req, avoid = opener.requests[0]
    assert list(req.tokenized.input_ids) == prompt + out[:3]
    assert req.sampling_params.max_new_tokens == 5 and req.sampling_params.n == 1
    assert req.logprob_start_len == -1 and req.stream and req.request_id == "rid-r1"
    assert avoid == {"w1"}
    # Usage stays the original prompt's; completion counts every generated token.
    assert gen.usage.prompt_tokens == len(prompt) and gen.usage.cached_tokens == 1
    assert gen.usage.completion_tokens == 8
    assert obs.resumes == [("w1", "ok")]
    assert opener.streams[0].closed


async def test_stop_string_spanning_the_break_still_matches(tok: Tokenizer) -> None:
    prompt = words(tok, "Say:")
    out = words(tok, " alpha beta gamma delta")
    prepared = prepare(tok, prompt, stop=("beta gam",), max_new_tokens=20)
    cut = 2  # " alpha", " beta" | " gamma" ...
    first = FakeStream(FakeWorker("w1"), [chunk(out[:cut]), WorkerError("boom")])
    opener = Opener([("w2", [chunk(out[cut:]), complete()])])
    gen = Generation(first, prepared, Resumer(base_request(prepared), opener, ResumeConfig(), prepared.sampling, NULL_OBSERVER))
    deltas = await collect(gen)
    assert "".join(d.text for d in deltas) == " alpha "
    assert deltas[-1].finish_reason == "stop" and deltas[-1].matched_stop == "beta gam"
    assert opener.streams[0].aborted == ["finished by gateway"]  # the continuation is stopped here


async def test_n2_each_unfinished_sample_continues_under_its_index(tok: Tokenizer) -> None:
    prompt = words(tok, "Two:")
    a = words(tok, " red green blue")
    b = words(tok, " cat dog cow")
    prepared = prepare(tok, prompt, n=2, max_new_tokens=3)
    first = FakeStream(FakeWorker("w1"), [chunk(a[:1], 0), chunk(b[:2], 1), WorkerError("gone")])
    opener = Opener([
        ("w2", [chunk(a[1:3]), complete()]),
        ("w3", [chunk(b[2:3]), complete()]),
    ])
    gen = Generation(first, prepared, Resumer(base_request(prepared), opener, ResumeConfig(), prepared.sampling, NULL_OBSERVER))
    deltas = await collect(gen)
    text = {i: "".join(d.text for d in deltas if d.index == i) for i in (0, 1)}
    assert text == {0: tok.decode(a[:3]), 1: tok.decode(b[:3])}
    (ra, _), (rb, _) = opener.requests
    assert list(ra.tokenized.input_ids) == prompt + a[:1] and ra.sampling_params.max_new_tokens == 2
    assert list(rb.tokenized.input_ids) == prompt + b[:2] and rb.sampling_params.max_new_tokens == 1
    assert {ra.request_id, rb.request_id} == {"rid-r1-0", "rid-r1-1"}
    assert gen.usage.per_sample_completion == {0: 3, 1: 3}


async def test_a_finished_sample_is_not_resumed(tok: Tokenizer) -> None:
    prompt = words(tok, "Two:")
    a = words(tok, " red green blue")
    prepared = prepare(tok, prompt, n=2, max_new_tokens=3)
    first = FakeStream(FakeWorker("w1"), [chunk(a[:3], 0), complete(0), chunk(a[:1], 1), WorkerError("gone")])
    opener = Opener([("w2", [chunk(a[1:3]), complete()])])
    gen = Generation(first, prepared, Resumer(base_request(prepared), opener, ResumeConfig(), prepared.sampling, NULL_OBSERVER))
    deltas = await collect(gen)
    assert len(opener.requests) == 1
    assert [d.index for d in deltas if d.finish_reason] == [0, 1]


async def test_budget_reached_before_the_failure_finishes_locally(tok: Tokenizer) -> None:
    prompt = words(tok, "x")
    out = words(tok, " a b c")[:3]
    prepared = prepare(tok, prompt, max_new_tokens=3)
    first = FakeStream(FakeWorker("w1"), [chunk(out), WorkerError("died before its complete")])
    opener = Opener([])
    gen = Generation(first, prepared, Resumer(base_request(prepared), opener, ResumeConfig(), prepared.sampling, NULL_OBSERVER))
    deltas = await collect(gen)
    assert deltas[-1].finish_reason == "length" and not opener.requests


async def test_early_end_of_stream_is_resumed(tok: Tokenizer) -> None:
    prompt = words(tok, "x")
    out = words(tok, " a b c d")[:4]
    prepared = prepare(tok, prompt, max_new_tokens=4)
    first = FakeStream(FakeWorker("w1"), [chunk(out[:2])])  # ends without a complete
    opener = Opener([("w2", [chunk(out[2:]), complete()])])
    gen = Generation(first, prepared, Resumer(base_request(prepared), opener, ResumeConfig(), prepared.sampling, NULL_OBSERVER))
    assert [t for d in await collect(gen) for t in d.token_ids] == out


@pytest.mark.parametrize(
    ("sampling", "config", "why"),
    [
        ({"seed": 7}, {}, "seeded"),
        ({"constraint": Constraint("regex", "a+")}, {}, "constrained decoding"),
        ({"presence_penalty": 0.5}, {}, "penalties"),
        ({}, {"resume": False}, "--no-resume"),
        ({}, {"max_resumes": 0}, "--max-resumes"),
    ],
)
async def test_refused_resumes_end_with_a_clean_error(tok: Tokenizer, sampling: dict[str, Any], config: dict[str, Any], why: str) -> None:
    prepared = prepare(tok, words(tok, "x"), **sampling)
    first = FakeStream(FakeWorker("w1"), [chunk(words(tok, " a")), WorkerError("w1 died")])
    opener = Opener([])
    gen = Generation(first, prepared, Resumer(base_request(prepared), opener, ResumeConfig(**config), prepared.sampling, NULL_OBSERVER))
    with pytest.raises(WorkerError) as info:
        await collect(gen)
    assert "w1 died" in info.value.message and why in info.value.message
    assert not opener.requests


async def test_client_faults_are_not_resumed(tok: Tokenizer) -> None:
    prepared = prepare(tok, words(tok, "x"))
    first = FakeStream(FakeWorker("w1"), [chunk(words(tok, " a")), InvalidRequestError("bad")])
    opener = Opener([])
    gen = Generation(first, prepared, Resumer(base_request(prepared), opener, ResumeConfig(), prepared.sampling, NULL_OBSERVER))
    with pytest.raises(InvalidRequestError):
        await collect(gen)
    assert not opener.requests


async def test_resumes_are_bounded_and_avoid_every_failed_worker(tok: Tokenizer) -> None:
    prepared = prepare(tok, words(tok, "x"), max_new_tokens=20)
    t = words(tok, " a")
    first = FakeStream(FakeWorker("w1"), [chunk(t), WorkerError("1")])
    opener = Opener([("w2", [chunk(t), WorkerError("2")]), ("w3", [chunk(t), WorkerError("3")])])
    gen = Generation(first, prepared, Resumer(base_request(prepared), opener, ResumeConfig(max_resumes=2), prepared.sampling, NULL_OBSERVER))
    with pytest.raises(GatewayError) as info:
        await collect(gen)
    assert "already resumed 2 times" in info.value.message
    assert [avoid for _, avoid in opener.requests] == [{"w1"}, {"w1", "w2"}]
    assert list(opener.requests[1][0].tokenized.input_ids)[-2:] == t * 2


async def test_a_failed_continuation_open_ends_the_request(tok: Tokenizer) -> None:
    prepared = prepare(tok, words(tok, "x"))
    first = FakeStream(FakeWorker("w1"), [chunk(words(tok, " a")), WorkerError("1")])
    opener = Opener([("w2", WorkerError("no one"))])  # type: ignore[list-item]
    obs = Recorder()
    gen = Generation(first, prepared, Resumer(base_request(prepared), opener, ResumeConfig(), prepared.sampling, obs))
    with pytest.raises(WorkerError, match="no one"):
        await collect(gen)
    assert obs.resumes == [("w1", "failed")]


def test_continuation_request_keeps_sampling_and_shrinks_budgets(tok: Tokenizer) -> None:
    prepared = prepare(tok, [1, 2, 3], temperature=0.7, top_p=0.9, min_new_tokens=5, max_new_tokens=10)
    req = continuation_request(base_request(prepared), [7, 8], request_id="x")
    sp = req.sampling_params
    assert list(req.tokenized.input_ids) == [1, 2, 3, 7, 8] and not req.tokenized.original_text
    assert sp.max_new_tokens == 8 and sp.min_new_tokens == 3
    assert sp.temperature == pytest.approx(0.7) and sp.top_p == pytest.approx(0.9) and sp.ignore_eos


def test_not_resumable_allows_ordinary_sampling() -> None:
    assert not_resumable(SamplingOptions(temperature=0.5, top_k=40, stop=("x",))) is None
