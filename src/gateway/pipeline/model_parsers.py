"""Settle one served model's parsers and chat template when its tokenizer loads.

``auto`` is resolved here, once per model, from the chat template, the
vocabulary and the model's name (``gateway.parsers.detect``); the choice is
logged and shown on the model's card in ``GET /v1/models``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from gateway.parsers.config import AUTO, ParserConfig
from gateway.parsers.detect import ModelFacts, detect_parsers
from gateway.parsers.registry import NO_REASONING, canonical_reasoning_parser, canonical_tool_parser
from gateway.tokenization import Tokenizer

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ModelParsers:
    tool_call_parser: str | None
    reasoning_parser: str | None
    note: str


def settle_model_parsers(
    config: ParserConfig, names: set[str], tokenizer: Tokenizer, model_type: str
) -> ModelParsers:
    """Apply a configured chat template to ``tokenizer`` and choose the model's parsers."""
    tool, reasoning, template_file = config.for_model(names)
    if template_file is not None:
        tokenizer.override_chat_template(Path(template_file).read_text(encoding="utf-8"))
        log.info("chat template for %s read from %s", sorted(names)[0], template_file)
    facts = ModelFacts(
        model_type=model_type,
        name=" ".join(sorted(names)),
        template="\n".join(tokenizer.chat_template_sources().values()),
        has_token=lambda text: tokenizer.token_id(text) is not None,
    )
    found = detect_parsers(facts)
    tool_name = found.tool if tool == AUTO else canonical_tool_parser(tool)
    if reasoning == AUTO:
        reasoning_name = found.reasoning
    elif reasoning == NO_REASONING:
        reasoning_name = None
    else:
        reasoning_name = canonical_reasoning_parser(reasoning)
    note = found.why if AUTO in (tool, reasoning) else "configured"
    log.info(
        "parsers for %s: tool calls %s, reasoning %s (%s%s)",
        "/".join(sorted(names)), tool_name or "none", reasoning_name or "none",
        "auto: " if AUTO in (tool, reasoning) else "", note,
    )
    return ModelParsers(tool_name, reasoning_name, note)
