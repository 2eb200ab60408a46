"""gpt-oss Harmony messages as tool calls (parsers/tool_calls/harmony.py): the header's
channel and recipient, messages closed by their end markers or by the end of the output."""

from __future__ import annotations

from gateway.parsers.tool_calls.harmony import HarmonyToolParser, read_message, tool_name
from tests.parsers.split_check import assert_tool_split_invariant
from tests.parsers.tool_calls.common import TOOLS


def test_a_message_header_and_body() -> None:
    one = '<|channel|>commentary to=functions.get_time <|constrain|>json<|message|>{"zone": "CET"}<|call|>'
    msg = read_message(one + "rest", final=False)
    assert msg is not None and (msg.channel, msg.recipient, msg.body, msg.closed) == ("commentary", "functions.get_time", '{"zone": "CET"}', True)
    assert msg.end == len(one)
    assert read_message("<|channel|>analysis", final=False) is None  # the header is not finished
    open_msg = read_message("<|channel|>final<|message|>Hello <|", final=False)
    assert open_msg is not None and open_msg.body == "Hello " and not open_msg.closed  # "<|" may start an end marker
    assert read_message("<|channel|>final<|message|>Hello", final=True).closed  # type: ignore[union-attr]
    assert tool_name("functions.get_weather") == "get_weather" and tool_name("browser.open") == "browser.open"


def test_calls_and_final_content_whole_and_split() -> None:
    def make() -> HarmonyToolParser:
        return HarmonyToolParser(tools=TOOLS)

    call = '<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city": "Paris", "days": 3}<|call|>'
    assert assert_tool_split_invariant(make, call) == ("", [("get_weather", {"city": "Paris", "days": 3})])
    both = ('<|channel|>commentary<|message|>Checking the weather.<|end|><|start|>assistant to=functions.get_time'
            '<|channel|>commentary json<|message|>{"zone": "CET"}<|call|>')
    assert assert_tool_split_invariant(make, both) == ("Checking the weather.", [("get_time", {"zone": "CET"})])
    assert make().parse("<|channel|>final<|message|>It is sunny.<|return|>") == ("It is sunny.", [])
