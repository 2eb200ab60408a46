"""Which parsers and chat template each served model uses: the ``--tool-call-parser`` family of flags.

A global value applies to every model; ``MODEL=VALUE`` items override it for
one model (matched against the served name, the worker's model name or its
model path), for gateways in front of several models.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from gateway.parsers.registry import NO_REASONING, reasoning_parser_names, tool_parser_names
from gateway.settings import option

AUTO = "auto"


class ParserConfigError(RuntimeError):
    """A parser flag names no known parser, or a template file is missing (start-up fails)."""


def _per_model(items: list[str], flag: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in items:
        model, sep, value = item.rpartition("=")
        if not sep or not model or not value:
            raise ParserConfigError(f"{flag} takes MODEL=VALUE items, got {item!r}")
        out[model] = value
    return out


@dataclass
class ParserConfig:
    tool_call_parser: str = option(
        AUTO,
        "tool-call format of the served models: 'auto' (from each model's chat template, special "
        "tokens and name; logged and shown in GET /v1/models) or a parser name, SGLang's and SMG's "
        "names included (hermes, qwen25, qwen3_coder, llama3, pythonic, mistral, deepseekv3, "
        "deepseekv31, deepseekv32, kimi_k2, glm45, glm47, minimax-m2, gpt-oss, json, passthrough...)",
    )
    tool_call_parser_for: list[str] = option(
        [], "MODEL=NAME items: the tool-call parser of one served model, overriding --tool-call-parser"
    )
    reasoning_parser: str = option(
        AUTO,
        "reasoning format: 'auto', 'none' (no splitting) or a parser name (qwen3, qwen3-thinking, "
        "deepseek-r1, kimi, glm45, minimax, minimax-append-think, gpt-oss...)",
    )
    reasoning_parser_for: list[str] = option(
        [], "MODEL=NAME items: the reasoning parser of one served model, overriding --reasoning-parser"
    )
    chat_template: str | None = option(
        None, "Jinja chat template file used instead of every served model's own"
    )
    chat_template_for: list[str] = option(
        [], "MODEL=FILE items: the chat template file of one served model, overriding --chat-template"
    )

    def check(self) -> None:
        """Fail at start-up, naming the known parsers, on a name no parser has."""
        tools = set(tool_parser_names()) | {AUTO}
        reasoning = set(reasoning_parser_names()) | {AUTO, NO_REASONING}
        for name in [self.tool_call_parser, *_per_model(self.tool_call_parser_for, "--tool-call-parser-for").values()]:
            if name not in tools:
                raise ParserConfigError(f"unknown tool-call parser {name!r}; known: auto, {', '.join(tool_parser_names())}")
        for name in [self.reasoning_parser, *_per_model(self.reasoning_parser_for, "--reasoning-parser-for").values()]:
            if name not in reasoning:
                raise ParserConfigError(f"unknown reasoning parser {name!r}; known: auto, {', '.join(reasoning_parser_names())}")
        files = [self.chat_template, *_per_model(self.chat_template_for, "--chat-template-for").values()]
        for file in files:
            if file is not None and not Path(file).is_file():
                raise ParserConfigError(f"chat template file {file} does not exist")

    def for_model(self, names: set[str]) -> tuple[str, str, str | None]:
        """(tool-call parser, reasoning parser, chat template file) for a model known by ``names``."""
        def pick(items: list[str], flag: str, default: str | None) -> str | None:
            table = _per_model(items, flag)
            return next((table[n] for n in names if n in table), default)

        tool = pick(self.tool_call_parser_for, "--tool-call-parser-for", self.tool_call_parser) or AUTO
        reasoning = pick(self.reasoning_parser_for, "--reasoning-parser-for", self.reasoning_parser) or AUTO
        template = pick(self.chat_template_for, "--chat-template-for", self.chat_template)
        return tool, reasoning, template
