"""Parser flags: validation at start-up and per-model choice."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.parsers.config import ParserConfig, ParserConfigError


def test_defaults_are_auto_and_valid() -> None:
    config = ParserConfig()
    config.check()
    assert config.for_model({"any"}) == ("auto", "auto", None)


def test_unknown_names_fail_listing_known_ones() -> None:
    with pytest.raises(ParserConfigError, match=r"unknown tool-call parser 'llama5'; known: auto, .*qwen3_coder"):
        ParserConfig(tool_call_parser="llama5").check()
    with pytest.raises(ParserConfigError, match="unknown reasoning parser"):
        ParserConfig(reasoning_parser_for=["m=o1"]).check()
    with pytest.raises(ParserConfigError, match="MODEL=VALUE"):
        ParserConfig(tool_call_parser_for=["just-a-name"]).check()
    with pytest.raises(ParserConfigError, match="does not exist"):
        ParserConfig(chat_template="/nonexistent/template.jinja").check()


def test_per_model_items_override_the_global_value(tmp_path: Path) -> None:
    template = tmp_path / "t.jinja"
    template.write_text("{{ messages[0].content }}")
    config = ParserConfig(
        tool_call_parser="hermes",
        tool_call_parser_for=["meta-llama/Llama-3.1-8B-Instruct=llama3", "mistral=mistral"],
        reasoning_parser="none",
        reasoning_parser_for=["org/r1=deepseek-r1"],
        chat_template_for=[f"mistral={template}"],
    )
    config.check()
    assert config.for_model({"llama", "meta-llama/Llama-3.1-8B-Instruct"}) == ("llama3", "none", None)
    assert config.for_model({"mistral"}) == ("mistral", "none", str(template))
    assert config.for_model({"org/r1"}) == ("hermes", "deepseek-r1", None)
    assert config.for_model({"other"}) == ("hermes", "none", None)
