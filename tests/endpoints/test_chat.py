"""The chat stream's text path (``_chunks`` with a door's frame) sends, event for event,
the bytes of the general path when each worker message comes alone, one event per batch
that reads the same when they come together, and records the same reply for
--reply-token-reuse: random token streams in any chunking, token stops, stop strings, usage
chunks, reasoning parsers (a batch's text split as one piece, its tokens counted), a
reasoning answer whose tokens after ``</think>`` take the template path, a worker failure
resumed mid-stream."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any
from unittest import mock

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.endpoints import chat
from gateway.endpoints.chat_parsers import ChatParsers
from gateway.pipeline.generation import Generation
from gateway.pipeline.observer import NULL_OBSERVER
from gateway.pipeline.prepared import PreparedRequest
from gateway.pipeline.request_context import RequestContext
from gateway.pipeline.resume import ResumeConfig, Resumer
from gateway.protocol.chat import ChatCompletionRequest
from gateway.protocol.errors import WorkerError
from gateway.protocol.sampling import sampling_from_chat
from gateway.tokenization import StopPlan, Tokenizer
from tests.endpoints.test_completions import FRAME, TEXT, _bytes, _script, draw_case, same_stream
from tests.pipeline.test_resume import FakeStream, FakeWorker, Opener, base_request
from tests.tokenization.helpers import qwen_files


@pytest.fixture(scope="module")
def tok() -> Tokenizer:
    return Tokenizer.from_path(qwen_files(), name="Qwen/Qwen3-0.6B")


class Replies:
    """A reply cache that records what it is given."""

    def __init__(self) -> None:
        self.records: list[tuple[Any, ...]] = []

    def record(self, salt: Any, content: str, ids: list[int], stops: Any) -> None:
        self.records.append((salt, content, list(ids)))


def _parsers(reasoning: bool, think_ids: tuple[int, int] | None = None, *, thinking: bool = True) -> ChatParsers:
    return ChatParsers(
        reasoning_enabled=reasoning, enable_thinking=reasoning, separate_reasoning=True, tool_choice="none",
        tools=(), think_end_id=think_ids[1] if think_ids else None, think_start_id=think_ids[0] if think_ids else None,
        reasoning_parser="qwen3" if reasoning else None,
        chat_template_kwargs=() if thinking else (("enable_thinking", False),),
    )


async def _both(
    tok: Tokenizer, body: dict[str, Any], script: list[Any], *, reasoning: bool = False, resume: list[Any] | None = None,
    together: bool = False, parsers: ChatParsers | None = None, raw: list[int] | None = None,
) -> tuple[list[bytes], list[bytes], list[Any], list[Any], bool]:
    """Both paths' bytes and recorded replies; ``raw`` gets how many events the template
    run wrote as ready bytes (the template path's)."""
    req = ChatCompletionRequest.model_validate({"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True, **body})
    runs: list[list[bytes]] = []
    records: list[list[Any]] = []
    plain = False
    created = int(time.time())  # both paths stamp the same second, however long a run takes
    with mock.patch.object(chat, "now", lambda: created):
        for frame in (None, FRAME):
            sampling = sampling_from_chat(req)
            plan = StopPlan.build(
                tok, stop=list(sampling.stop), stop_token_ids=list(sampling.stop_token_ids or ()),
                ignore_eos=sampling.ignore_eos, skip_special_tokens=sampling.skip_special_tokens,
            )
            prepared = PreparedRequest("rid", "m", [1, 2, 3], sampling, plan, tok, stream=True)
            resumer = None
            if resume is not None:
                resumer = Resumer(base_request(prepared), Opener([("w2", list(resume))]), ResumeConfig(), sampling, NULL_OBSERVER)
            stream = FakeStream(FakeWorker("w1"), list(script), together=together and frame is not None)
            gen = Generation(stream, prepared, resumer)  # type: ignore[arg-type]
            plain = gen.plain
            replies = Replies()
            entry: Any = type("Entry", (), {"name": "m", "tokenizer": tok, "reply_cache": replies})()
            chosen = parsers if parsers is not None else _parsers(reasoning)
            events = _count_raw(
                chat._chunks(req, entry, gen, "prompt", chosen, RequestContext(request_id="r"), frame),
                raw if frame is not None else None,
            )
            runs.append(await _bytes(events))
            records.append(replies.records)
    return runs[0], runs[1], records[0], records[1], plain


async def _count_raw(events: AsyncIterator[Any], raw: list[int] | None) -> AsyncIterator[Any]:
    async for e in events:
        if raw is not None and isinstance(e, bytes):
            raw.append(len(e))
        yield e


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    data=st.data(),
    cuts=st.lists(st.sampled_from([1, 1, 1, 1, 2, 3]), min_size=1, max_size=6),
    complete=st.booleans(),
    usage=st.booleans(),
    stops=st.sampled_from(["none", "eos", "token", "string"]),
    reasoning=st.booleans(),
    together=st.booleans(),
)
async def test_template_path_sends_the_general_paths_bytes(
    tok: Tokenizer, data: st.DataObject, cuts: list[int], complete: bool, usage: bool, stops: str, reasoning: bool,
    together: bool,
) -> None:
    ids, body = draw_case(tok, data, usage, stops)
    general, template, rec_general, rec_template, plain = await _both(
        tok, body, _script(ids, cuts, complete), reasoning=reasoning, together=together,
    )
    assert same_stream(general, template, together, joined=1)
    assert rec_template == rec_general
    assert plain == (stops != "string")


@pytest.mark.parametrize("together", [False, True])
async def test_a_resumed_stream_sends_the_same_bytes_and_reply(tok: Tokenizer, together: bool) -> None:
    ids = tok.encode(TEXT, False)
    first = [*_script(ids[:5], [1], False), WorkerError("w1 died")]
    rest = _script(ids[5:12], [1, 2], True)
    general, template, rec_general, rec_template, plain = await _both(
        tok, {"max_tokens": 12, "ignore_eos": True}, first, resume=rest, together=together,
    )
    assert plain and same_stream(general, template, together, joined=1)
    assert rec_template == rec_general and rec_template and rec_template[0][1] == tok.decode(ids[:12])
    assert sum(1 for e in template if isinstance(e, bytes) and b'"finish_reason":"length"' in e) == 1


REASONING = "<think>\nLet me see: wörld 🙂, 2+2.\n</think>\n\nThe answer is 4, naïve café 🚀 end"


@pytest.mark.parametrize("cuts", [[1], [1, 2], [3, 1, 1]])
@pytest.mark.parametrize("together", [False, True])
@pytest.mark.parametrize("complete", [False, True])
async def test_a_reasoning_answers_content_goes_the_template_way_in_the_same_bytes(
    tok: Tokenizer, cuts: list[int], together: bool, complete: bool
) -> None:
    ids = tok.encode(REASONING, False)
    think = (tok.encode("<think>", False)[0], tok.encode("</think>", False)[0])
    assert ids[0] == think[0] and think[1] in ids  # the tags are single tokens: the count is exact
    raw: list[int] = []
    body = {"max_tokens": 64, "ignore_eos": True, "stream_options": {"include_usage": True}}
    general, template, rec_general, rec_template, _ = await _both(
        tok, body, _script(ids, cuts, complete), together=together, parsers=_parsers(True, think), raw=raw,
    )
    assert same_stream(general, template, together)
    assert rec_template == rec_general == []  # a reasoning reply is never recorded
    joined = b"".join(general)
    assert b'"reasoning_content":"Let' in joined and b'"content":"The' in joined
    if complete:  # else the stream ends in the worker's error, after the same content
        counted = f'"reasoning_tokens":{ids.index(think[1]) + 1}}}'.encode()
        assert b'"usage"' in general[-1] and counted in general[-1]
    else:
        assert general[-1].startswith(b"error 502")
    assert raw  # the content after the split went out as template bytes


# (tokens kept, chunk sizes): a byte piece with no text of its own (the 5th token) comes
# alone, then the end of the stream; then a chunk of two; then any cutting of the whole.
@pytest.mark.parametrize(("keep", "cuts"), [(5, [1]), (7, [1, 1, 1, 1, 1, 2]), (10, [1, 2]), (10, [2, 1, 3])])
@pytest.mark.parametrize("together", [False, True])
async def test_tokens_with_no_text_inside_the_think_block_are_counted_once(
    tok: Tokenizer, keep: int, cuts: list[int], together: bool
) -> None:
    ids = tok.encode("<think>\nhmm \U0001d518\U0001d52b\U0001d526", False)[:keep]
    assert tok.decode(ids[4:5]).endswith("\ufffd")  # the first byte of a four-byte character
    think = (tok.encode("<think>", False)[0], tok.encode("</think>", False)[0])
    body = {"max_tokens": 64, "ignore_eos": True, "stream_options": {"include_usage": True}}
    general, template, *_ = await _both(tok, body, _script(ids, cuts, True), together=together, parsers=_parsers(True, think))
    assert same_stream(general, template, together)
    counted = f'"reasoning_tokens":{len(ids)}}}'.encode()  # never closed: every token is reasoning
    assert counted in general[-1] and counted in template[-1]


@pytest.mark.parametrize("together", [False, True])
async def test_thinking_off_sends_the_template_paths_bytes_from_the_first_token(tok: Tokenizer, together: bool) -> None:
    ids = tok.encode("Plain answer, wörld 🙂 end", False)
    think = (tok.encode("<think>", False)[0], tok.encode("</think>", False)[0])
    raw: list[int] = []
    body = {"max_tokens": 64, "ignore_eos": True, "stream_options": {"include_usage": True}}
    general, template, rec_general, rec_template, _ = await _both(
        tok, body, _script(ids, [1], True), together=together, parsers=_parsers(True, think, thinking=False), raw=raw,
    )
    assert same_stream(general, template, together)
    assert rec_template == rec_general and rec_general[0][1] == "Plain answer, wörld 🙂 end"
    assert raw
