"""Chat deltas -> content blocks: reasoning, text and each tool call are their own block."""

from __future__ import annotations

from gateway.endpoints.turn import BlockDelta, BlockStart, BlockStop, TurnBlocks, TurnEnd
from gateway.protocol.stream import ChatDelta, ToolCallFragment


def _names(events: list[object]) -> list[str]:
    out = []
    for e in events:
        if isinstance(e, BlockStart | BlockDelta | BlockStop):
            out.append(f"{type(e).__name__}:{e.block.index}:{e.block.kind}")
        else:
            out.append(type(e).__name__)
    return out


def test_reasoning_then_text_then_two_calls() -> None:
    t = TurnBlocks()
    events = []
    events += t.feed(ChatDelta(0, role="assistant", content=""))  # the role chunk opens nothing
    events += t.feed(ChatDelta(0, reasoning_content="think "))
    events += t.feed(ChatDelta(0, reasoning_content="more"))
    events += t.feed(ChatDelta(0, content="Answer"))
    events += t.feed(ChatDelta(0, tool_calls=[ToolCallFragment(0, '{"a":', id="call_1", name="f")]))
    events += t.feed(ChatDelta(0, tool_calls=[ToolCallFragment(0, " 1}")]))
    events += t.feed(ChatDelta(0, tool_calls=[ToolCallFragment(1, "{}", id="call_2", name="g")]))
    events += t.feed(ChatDelta(0, finish_reason="tool_calls", final=True))
    assert _names(events) == [
        "BlockStart:0:reasoning", "BlockDelta:0:reasoning", "BlockDelta:0:reasoning",
        "BlockStop:0:reasoning", "BlockStart:1:text", "BlockDelta:1:text",
        "BlockStop:1:text", "BlockStart:2:tool_call", "BlockDelta:2:tool_call", "BlockDelta:2:tool_call",
        "BlockStop:2:tool_call", "BlockStart:3:tool_call", "BlockDelta:3:tool_call",
        "BlockStop:3:tool_call", "TurnEnd",
    ]
    assert [(b.kind, b.text, b.call_id, b.name) for b in t.blocks] == [
        ("reasoning", "think more", None, None), ("text", "Answer", None, None),
        ("tool_call", '{"a": 1}', "call_1", "f"), ("tool_call", "{}", "call_2", "g"),
    ]
    end = events[-1]
    assert isinstance(end, TurnEnd) and end.finish_reason == "tool_calls"


def test_text_with_its_final_delta_and_matched_stop() -> None:
    t = TurnBlocks()
    events = t.feed(ChatDelta(0, content="Hi"))
    events += t.feed(ChatDelta(0, content=" there", finish_reason="stop", final=True, matched_stop="END"))
    assert _names(events) == ["BlockStart:0:text", "BlockDelta:0:text", "BlockDelta:0:text", "BlockStop:0:text", "TurnEnd"]
    end = events[-1]
    assert isinstance(end, TurnEnd) and end.matched_stop == "END" and t.blocks[0].text == "Hi there"


def test_empty_answer_ends_without_blocks() -> None:
    t = TurnBlocks()
    assert _names(t.feed(ChatDelta(0, finish_reason="length", final=True))) == ["TurnEnd"]
    assert t.blocks == []


def test_text_logprobs_follow_their_text() -> None:
    """A token whose text is held back (a partial stop, a split character) gives its logprob
    with the text that comes out later; reasoning tokens' logprobs are not the text's."""
    from gateway.protocol.responses import ChoiceLogprobs, TokenLogprob

    def lps(*tokens: str) -> ChoiceLogprobs:
        return ChoiceLogprobs(content=[TokenLogprob(token=t, logprob=-0.5) for t in tokens])

    t = TurnBlocks()
    events = t.feed(ChatDelta(0, reasoning_content="hm", logprobs=lps("hm")))
    events += t.feed(ChatDelta(0, logprobs=lps("He")))  # held back: no text yet
    events += t.feed(ChatDelta(0, content="Hello", logprobs=lps("llo")))
    events += t.feed(ChatDelta(0, logprobs=lps("<end>"), finish_reason="stop", final=True))
    deltas = [e for e in events if isinstance(e, BlockDelta) and e.block.kind == "text"]
    assert [[lp.token for lp in d.logprobs or []] for d in deltas] == [["He", "llo"]]
    assert [lp.token for lp in t.blocks[1].logprobs] == ["He", "llo", "<end>"] and t.blocks[0].logprobs == []
