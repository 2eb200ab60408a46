"""Settling a served model's parsers and chat template when its tokenizer loads."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from gateway.parsers.config import ParserConfig
from gateway.pipeline.model_parsers import settle_model_parsers
from gateway.tokenization.tokenizer import Tokenizer
from tests.tokenization.helpers import copy_tokenizer, qwen_files


@pytest.fixture
def qwen(tmp_path: Path) -> Tokenizer:
    return Tokenizer.from_path(copy_tokenizer(qwen_files(), tmp_path / "qwen"))


def test_auto_reads_the_template_and_logs_the_choice(qwen: Tokenizer, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO):
        chosen = settle_model_parsers(ParserConfig(), {"Qwen/Qwen3-0.6B"}, qwen, "qwen3")
    assert (chosen.tool_call_parser, chosen.reasoning_parser) == ("hermes", "qwen3")
    assert "parsers for Qwen/Qwen3-0.6B: tool calls hermes, reasoning qwen3 (auto:" in caplog.text


def test_configured_names_are_canonical_and_none_turns_reasoning_off(qwen: Tokenizer) -> None:
    config = ParserConfig(tool_call_parser_for=["m=qwen_coder"], reasoning_parser="none")
    chosen = settle_model_parsers(config, {"m"}, qwen, "qwen3")
    assert (chosen.tool_call_parser, chosen.reasoning_parser) == ("qwen3_coder", None)
    chosen = settle_model_parsers(ParserConfig(tool_call_parser="kimik2", reasoning_parser="deepseek_r1"), {"x"}, qwen, "")
    assert (chosen.tool_call_parser, chosen.reasoning_parser) == ("kimi_k2", "deepseek-r1")


def test_chat_template_file_replaces_the_model_template(qwen: Tokenizer, tmp_path: Path) -> None:
    template = tmp_path / "mistral.jinja"
    template.write_text("{% for m in messages %}[INST]{{ m.content }}[/INST]{% endfor %}{# [TOOL_CALLS] #}")
    chosen = settle_model_parsers(ParserConfig(chat_template=str(template)), {"m"}, qwen, "")
    assert qwen.apply_chat_template([{"role": "user", "content": "hi"}]) == "[INST]hi[/INST]"
    assert chosen.tool_call_parser == "mistral"  # auto now reads the operator's template
