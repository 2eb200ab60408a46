"""``auto``: parser choice from template snippets, tokens and names (real templates: test_real_models)."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.parsers.detect import ModelFacts, detect_parsers

FIXTURES = Path(__file__).parent / "fixtures"


@pytest.mark.parametrize(
    ("facts", "tool", "reasoning"),
    [
        (ModelFacts(model_type="gpt_oss", name="openai/gpt-oss-20b"), "gpt-oss", "gpt-oss"),
        (ModelFacts(name="Kimi-K2-Instruct", has_token=lambda t: t == "<|tool_calls_section_begin|>"), "kimi_k2", None),
        (ModelFacts(name="mistralai/Mistral-Small-3.2-24B-Instruct-2506", has_token=lambda t: t == "[TOOL_CALLS]"), "mistral", None),
        (ModelFacts(model_type="llama4", name="meta-llama/Llama-4-Scout-17B-16E-Instruct"), "pythonic", None),
        (ModelFacts(model_type="llama", name="meta-llama/Llama-3.1-8B-Instruct", template="{{ '<|python_tag|>' }}"), "llama3", None),
        (ModelFacts(model_type="qwen2", name="Qwen/Qwen2.5-7B-Instruct", template="<tool_call>"), "hermes", None),
        (ModelFacts(model_type="qwen2", name="Qwen/QwQ-32B", template="<tool_call>"), "hermes", "qwen3"),
        (ModelFacts(model_type="qwen3_moe", name="Qwen/Qwen3-Coder-30B-A3B-Instruct", template="<tool_call>\n<function=x>\n<parameter=y>"), "qwen3_coder", "qwen3"),
        (ModelFacts(model_type="qwen3", name="Qwen/Qwen3-4B-Thinking-2507", template="<tool_call><think>"), "hermes", "qwen3-thinking"),
        (ModelFacts(model_type="deepseek_v32", name="deepseek-ai/DeepSeek-V3.2"), "deepseekv32", None),
        (ModelFacts(model_type="mistral", name="some/unknown-model"), None, None),
    ],
)
def test_detect(facts: ModelFacts, tool: str | None, reasoning: str | None) -> None:
    found = detect_parsers(facts)
    assert (found.tool, found.reasoning) == (tool, reasoning), found.why
    assert found.why


def test_kimi_k2_fixture_output() -> None:
    """Kimi K2's documented tool-call markup (fixtures/README.md names the source)."""
    from gateway.parsers.registry import get_tool_parser
    from tests.parsers.split_check import assert_tool_split_invariant

    text = (FIXTURES / "kimi-k2-output.txt").read_text(encoding="utf-8").rstrip("\n")
    tokens = {"<|tool_calls_section_begin|>", "<|tool_call_begin|>"}
    found = detect_parsers(ModelFacts(name="moonshotai/Kimi-K2-Instruct", has_token=tokens.__contains__))
    assert found.tool == "kimi_k2"
    content, calls = assert_tool_split_invariant(lambda: get_tool_parser(found.tool or ""), text)
    assert content == "I'll look that up."
    assert calls == [("get_weather", {"city": "Beijing"}), ("get_time", {"zone": "Asia/Shanghai"})]
