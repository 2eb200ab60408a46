"""The completion stream's template path (``json_events`` -> ``_plain_json``) sends, event
for event, the bytes of the general path (``_chunks`` + ``to_json``) when each worker
message comes alone, and one event per batch that reads the same when they come together:
random token streams in any chunking, token stops anywhere, stop strings, usage chunks, a
worker failure resumed mid-stream."""

from __future__ import annotations

import itertools
import time
from collections.abc import AsyncIterator
from typing import Any
from unittest import mock

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.endpoints import completions
from gateway.pipeline.generation import Generation
from gateway.pipeline.observer import NULL_OBSERVER
from gateway.pipeline.prepared import PreparedRequest
from gateway.pipeline.request_context import RequestContext
from gateway.pipeline.resume import ResumeConfig, Resumer
from gateway.proto import sglang_scheduler_pb2 as pb
from gateway.protocol.completions import CompletionRequest
from gateway.protocol.errors import GatewayError, WorkerError
from gateway.protocol.sampling import sampling_from_completion
from gateway.protocol.stream import CompletionDelta, StreamChunk, StreamHead
from gateway.tokenization import StopPlan, Tokenizer
from tests.pipeline.test_resume import FakeStream, FakeWorker, Opener, base_request, chunk, complete
from tests.tokenization.helpers import qwen_files

TEXT = "Hello, wörld! Ça va? 你好\uff0c世界\u3002 naïve café 🙂🚀 a\tb\nc \"quoted\" \\ back </s> end"


@pytest.fixture(scope="module")
def tok() -> Tokenizer:
    return Tokenizer.from_path(qwen_files(), name="Qwen/Qwen3-0.6B")


def _entry(tok: Tokenizer) -> Any:
    return type("Entry", (), {"name": "m", "tokenizer": tok})()


def _prepared(tok: Tokenizer, req: CompletionRequest) -> PreparedRequest:
    sampling = sampling_from_completion(req)
    plan = StopPlan.build(
        tok, stop=list(sampling.stop), stop_token_ids=list(sampling.stop_token_ids or ()),
        ignore_eos=sampling.ignore_eos, skip_special_tokens=sampling.skip_special_tokens,
    )
    return PreparedRequest("rid", "m", [1, 2, 3], sampling, plan, tok, stream=True)


FRAME = (b"data: ", b"\n\n")  # the HTTP door's


async def _bytes(events: AsyncIterator[Any]) -> list[bytes]:
    """Each event as the door writes it (bytes as they come, typed events framed); a stream
    that fails ends with the error's text (the door's error event)."""
    out: list[bytes] = []
    try:
        async for e in events:
            out.append(e if isinstance(e, bytes) else FRAME[0] + e.to_json() + FRAME[1])
    except GatewayError as exc:
        out.append(f"error {exc.status} {exc.message}".encode())
    return out


def _script(ids: list[int], cuts: list[int], complete: bool) -> list[Any]:
    """The ids cut into chunks at ``cuts`` (chunk sizes, cycled), then the complete message."""
    out: list[Any] = []
    at, k = 0, 0
    while at < len(ids):
        size = cuts[k % len(cuts)] if cuts else 1
        out.append(chunk(ids[at:at + size], prompt_tokens=3, cached=k % 3))
        at += size
        k += 1
    if complete:
        out.append(pb.GenerateResponse(complete=pb.GenerateComplete(finish_reason="length", prompt_tokens=3)))
    return out


def draw_case(tok: Tokenizer, data: st.DataObject, usage: bool, stops: str) -> tuple[list[int], dict[str, Any]]:
    """A random token stream of ``TEXT``'s ids and the request body that goes with ``stops``
    ("none", "eos" or "token": that stop id inserted anywhere, "string": two stop strings),
    with a usage chunk asked for when ``usage``."""
    base = tok.encode(TEXT, False)
    ids = data.draw(st.lists(st.sampled_from(base), min_size=0, max_size=40))
    body: dict[str, Any] = {"max_tokens": 64, "ignore_eos": stops != "eos"}
    if usage:
        body["stream_options"] = {"include_usage": True}
    if ids and stops in ("eos", "token"):
        stop_id = min(tok.eos_token_ids) if stops == "eos" else ids[data.draw(st.integers(0, len(ids) - 1))]
        at = data.draw(st.integers(0, len(ids)))
        ids = [*ids[:at], stop_id, *ids[at:]]
        if stops == "token":
            body["stop_token_ids"] = [stop_id]
    if stops == "string":
        body["stop"] = ["ld!", "va?"]
    return ids, body


def reading(events: list[bytes]) -> dict[str, Any]:
    """What a client reads from a stream: per choice its texts joined (content, reasoning,
    completion text), finish_reason and matched_stop; the usage; the error the stream ended
    in. Every event must be a whole, valid chunk."""
    choices: dict[int, dict[str, Any]] = {}
    out: dict[str, Any] = {"choices": choices, "usage": None, "error": None}
    for e in events:
        if not e.startswith(FRAME[0]):
            out["error"] = e
            continue
        for part in e.split(FRAME[1])[:-1]:
            assert part.startswith(FRAME[0]), part
            chunk = orjson.loads(part[len(FRAME[0]):])
            assert {"id", "object", "created", "model", "choices"} <= chunk.keys()
            for c in chunk["choices"]:
                got = choices.setdefault(c["index"], {"content": "", "reasoning": "", "text": "", "finish": None})
                delta = c.get("delta") or {}
                got["content"] += delta.get("content") or ""
                got["reasoning"] += delta.get("reasoning_content") or ""
                got["text"] += c.get("text") or ""
                if c["finish_reason"] is not None:
                    got["finish"] = (c["finish_reason"], c.get("matched_stop"))
            if chunk.get("usage"):
                out["usage"] = chunk["usage"]
    return out


def same_stream(general: list[bytes], template: list[bytes], together: bool, *, joined: int = 0) -> bool:
    """The client gets the same bytes, event for event, when each message came alone (but
    for ``joined`` writes of two events: a chat's role event and its first text); when they
    came together, the texts of a batch are one event (in fewer writes), and the client reads
    the same texts, finish reasons, usage and error."""
    if together:
        return reading(template) == reading(general) and len(template) <= len(general)
    if b"".join(template) != b"".join(general):
        return False
    if not set(itertools.accumulate(map(len, template))) <= set(itertools.accumulate(map(len, general))):
        return False  # a write that cuts an event
    return len(general) - joined <= len(template) <= len(general)


async def _both(
    tok: Tokenizer, body: dict[str, Any], script: list[Any], resume: list[Any] | None = None, *, together: bool = False,
) -> tuple[list[bytes], list[bytes], bool]:
    """The general path's events, then the template path's (whose worker messages came
    ``together`` when asked: every one already there when it is read)."""
    req = CompletionRequest.model_validate({"model": "m", "prompt": [1, 2, 3], "stream": True, **body})
    runs: list[list[bytes]] = []
    plain = False
    created = int(time.time())  # both paths stamp the same second, however long a run takes
    with mock.patch.object(completions, "now", lambda: created):
        for make in (completions._chunks, lambda *a: completions.json_events(*a, FRAME)):
            prepared = _prepared(tok, req)
            stream = FakeStream(FakeWorker("w1"), list(script), together=together and make is not completions._chunks)
            resumer = None
            if resume is not None:
                opener = Opener([("w2", list(resume))])
                resumer = Resumer(base_request(prepared), opener, ResumeConfig(), prepared.sampling, NULL_OBSERVER)
            gen = Generation(stream, prepared, resumer)  # type: ignore[arg-type]
            plain = gen.plain
            runs.append(await _bytes(make(req, _entry(tok), [gen], RequestContext(request_id="r"))))  # type: ignore[operator]
    return runs[0], runs[1], plain


def test_the_template_is_the_chunk_cut_around_its_text() -> None:
    head = StreamHead("cmpl-x", "text_completion", 7, 'mo"del')
    prefix, suffix = completions.text_template(head)
    for text in ["", " word", 'quo"te\\', "\x00\n\u2028", "你好🙂"]:
        assert prefix + orjson.dumps(text) + suffix == StreamChunk(head, [CompletionDelta(0, text)]).to_json()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    data=st.data(),
    cuts=st.lists(st.sampled_from([1, 1, 1, 1, 2, 3]), min_size=1, max_size=6),
    complete=st.booleans(),
    usage=st.booleans(),
    stops=st.sampled_from(["none", "eos", "token", "string"]),
    together=st.booleans(),
)
async def test_template_path_sends_the_general_paths_bytes(
    tok: Tokenizer, data: st.DataObject, cuts: list[int], complete: bool, usage: bool, stops: str, together: bool,
) -> None:
    ids, body = draw_case(tok, data, usage, stops)
    general, template, plain = await _both(tok, body, _script(ids, cuts, complete), together=together)
    assert same_stream(general, template, together)
    assert plain == (stops != "string")


@pytest.mark.parametrize("together", [False, True])
async def test_a_resumed_stream_sends_the_same_bytes(tok: Tokenizer, together: bool) -> None:
    ids = tok.encode(TEXT, False)
    first = [*_script(ids[:5], [1], False), WorkerError("w1 died")]
    rest = _script(ids[5:12], [1, 2], True)
    general, template, plain = await _both(tok, {"max_tokens": 12, "ignore_eos": True}, first, rest, together=together)
    assert plain and same_stream(general, template, together)
    assert b"".join(template).count(b'"finish_reason":"length"') == 1


async def test_tokens_that_arrived_together_go_out_in_one_event(tok: Tokenizer) -> None:
    ids = tok.encode(TEXT, False)[:12]
    general, template, _ = await _both(tok, {"max_tokens": 12, "ignore_eos": True}, _script(ids, [1], True), together=True)
    assert reading(template) == reading(general) and reading(general)["choices"][0]["text"] == tok.decode(ids)
    texts = [e for e in general if b'"finish_reason":null' in e]
    assert len(texts) >= 10  # one event per token on the general path
    ours = [e for e in template if b'"finish_reason":null' in e]
    assert len(ours) == 1 and ours[0].count(FRAME[0]) == 1  # all of them in one event


async def test_echo_logprobs_n_and_continuous_usage_take_the_general_path(tok: Tokenizer) -> None:
    for body in ({"echo": True}, {"logprobs": 1}, {"n": 2}, {"stream_options": {"include_usage": True, "continuous_usage_stats": True}}):
        req = CompletionRequest.model_validate({"model": "m", "prompt": [1, 2, 3], "stream": True, "max_tokens": 4, **body})
        gen = Generation(FakeStream(FakeWorker("w1"), []), _prepared(tok, req))  # type: ignore[arg-type]
        events = completions.json_events(req, _entry(tok), [gen], RequestContext(request_id="r"))
        assert events.__qualname__ == "_chunks", body  # type: ignore[attr-defined]


async def test_a_streamed_echo_with_logprobs_opens_with_the_prompts_logprobs(tok: Tokenizer) -> None:
    """As in a whole answer (and as vLLM's own server streams it): the first chunk's logprobs
    are the prompt's (its first token's null) and then the output's, offsets after the prompt."""
    req = CompletionRequest.model_validate(
        {"model": "m", "prompt": [1, 2, 3], "stream": True, "max_tokens": 2, "echo": True, "logprobs": 1}
    )
    first = chunk([40], prompt_tokens=3)
    first.chunk.input_logprobs.token_ids.extend([1, 2, 3])
    first.chunk.input_logprobs.token_logprobs.add()
    for v in (-0.5, -1.5):
        first.chunk.input_logprobs.token_logprobs.add(value=v)
    for row in ([], [(2, -0.5)], [(3, -1.5)]):
        first.chunk.input_logprobs.top_logprobs.add(token_ids=[t for t, _ in row], values=[v for _, v in row])
    first.chunk.output_logprobs.token_ids.append(40)
    first.chunk.output_logprobs.token_logprobs.append(-0.25)
    first.chunk.output_logprobs.top_logprobs.add(token_ids=[40], values=[-0.25])
    later = chunk([41], prompt_tokens=3)
    later.chunk.output_logprobs.token_ids.append(41)
    later.chunk.output_logprobs.token_logprobs.append(-0.75)
    later.chunk.output_logprobs.top_logprobs.add(token_ids=[41], values=[-0.75])
    gen = Generation(FakeStream(FakeWorker("w1"), [first, later, complete(prompt_tokens=3)]), _prepared(tok, req))  # type: ignore[arg-type]
    events = [e async for e in completions._chunks(req, _entry(tok), [gen], RequestContext(request_id="r"))]
    opening = orjson.loads(events[0].to_json())["choices"][0]
    prompt_text = tok.decode([1, 2, 3], skip_special_tokens=False)
    assert opening["text"] == prompt_text + tok.decode([40])
    lp = opening["logprobs"]
    assert lp["token_logprobs"] == [None, -0.5, -1.5, -0.25] and len(lp["tokens"]) == 4
    assert lp["top_logprobs"][0] is None and len(lp["top_logprobs"][1]) == 1
    assert lp["text_offset"][3] == len(prompt_text)  # the output's first token starts after the prompt
    then = orjson.loads(events[1].to_json())["choices"][0]["logprobs"]
    assert then["token_logprobs"] == [-0.75] and then["text_offset"] == [len(prompt_text + tok.decode([40]))]
