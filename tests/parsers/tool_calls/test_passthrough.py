"""The passthrough parser (parsers/tool_calls/passthrough.py): everything is content."""

from __future__ import annotations

from gateway.parsers.tool_calls.passthrough import PassthroughToolParser


def test_text_is_returned_untouched_whole_or_streamed() -> None:
    text = '<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call>'
    assert PassthroughToolParser().parse(text) == (text, [])
    parser = PassthroughToolParser()
    deltas = [parser.feed(text[:5]), parser.feed(text[5:]), parser.finish()]
    assert "".join(d.content for d in deltas) == text
    assert all(d.tool_calls == [] for d in deltas) and parser.calls_started == 0
    assert not deltas[-1]
