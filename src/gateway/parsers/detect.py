"""``auto``: which tool-call and reasoning parsers fit a model.

Read in this order, the first telling sign winning: the chat template (it
spells out the exact tool-call markup the model was trained on), the
vocabulary's special tokens (``<think>``, ``[TOOL_CALLS]``...), then
``model_type`` from config.json and the model's name. A model with no sign of
either gets no parser: its output is plain content, which is always safe.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass(frozen=True)
class ModelFacts:
    model_type: str = ""
    name: str = ""
    template: str = ""  # every chat template of the model, joined
    has_token: Callable[[str], bool] = field(default=lambda _t: False)


@dataclass(frozen=True)
class Detected:
    tool: str | None
    reasoning: str | None
    why: str


def _tool(f: ModelFacts) -> tuple[str | None, str]:
    t, kind, name = f.template, f.model_type.lower(), f.name.lower()
    if kind == "gpt_oss" or ("<|channel|>" in t and "to=functions" in t) or "gpt-oss" in name:
        return "gpt-oss", "Harmony channels"
    if "DSML" in t or kind == "deepseek_v32" or ("v3.2" in name and "deepseek" in name and "exp" not in name):
        return "deepseekv32", "DSML function_calls"
    if "tool▁calls▁begin" in t or f.has_token("<｜tool▁calls▁begin｜>"):
        if "function<｜tool▁sep｜>" in t or "```json" in t:
            return "deepseekv3", "DeepSeek V3 tool tokens with a json fence"
        if t:
            return "deepseekv31", "DeepSeek V3.1 tool tokens"
        return ("deepseekv31", "DeepSeek tool tokens, V3.1 name") if "v3.1" in name else ("deepseekv3", "DeepSeek tool tokens")
    if "tool_calls_section_begin" in t or f.has_token("<|tool_calls_section_begin|>"):
        return "kimi_k2", "Kimi tool-call section tokens"
    if "<minimax:tool_call>" in t or kind.startswith("minimax"):
        return "minimax-m2", "minimax:tool_call markup"
    if "<arg_key>" in t or kind in ("glm4_moe", "glm4"):
        if "4.7" in name or "glm-5" in name:
            return "glm47", "GLM arg_key markup, GLM-4.7 name"
        return "glm45", "GLM arg_key markup"
    if "<function=" in t and "<parameter=" in t:
        return "qwen3_coder", "Qwen3-Coder function/parameter markup"
    if "<tool_call>" in t:
        return "hermes", "<tool_call> JSON (Hermes/Qwen)"
    if "[TOOL_CALLS]" in t or f.has_token("[TOOL_CALLS]"):
        return "mistral", "[TOOL_CALLS] token"
    if "<|python_start|>" in t or kind.startswith("llama4"):
        return "pythonic", "Llama 4 pythonic calls"
    if "<|python_tag|>" in t or ("llama" in kind and "tools" in t):
        return "llama3", "Llama 3 JSON calls"
    if kind.startswith("qwen"):
        return "hermes", f"model_type {kind}"
    return None, "no tool-call markup found"


def _reasoning(f: ModelFacts, tool: str | None) -> tuple[str | None, str]:
    t, kind, name = f.template, f.model_type.lower(), f.name.lower()
    if tool == "gpt-oss":
        return "gpt-oss", "Harmony analysis channel"
    if f.has_token("◁think▷") or "◁think▷" in t:
        return "kimi", "◁think▷ tags"
    thinks = f.has_token("<think>") or "<think>" in t or kind.startswith("qwen3")
    if "deepseek" in kind or "deepseek" in name:
        if "r1" in name:
            return "deepseek-r1", "DeepSeek-R1"
        if thinks and "thinking" in t:
            return "qwen3", "DeepSeek thinking switch"
        return None, "DeepSeek chat"
    if kind == "qwen2" and "qwq" in name:
        return "qwen3", "QwQ"
    if not thinks:
        return None, "no think tags"
    if tool == "minimax-m2":
        return "minimax", "MiniMax think tags"
    if tool in ("glm45", "glm47"):
        return "glm45", "GLM think tags"
    if "thinking-2507" in name or ("thinking" in name and "qwen3" in name):
        return "qwen3-thinking", "Qwen3 thinking-only model"
    if "kimi" in name:
        return "kimi_k2", "Kimi K2 thinking"
    return "qwen3", "<think> tags"


def detect_parsers(facts: ModelFacts) -> Detected:
    tool, why_tool = _tool(facts)
    reasoning, why_reasoning = _reasoning(facts, tool)
    return Detected(tool, reasoning, f"tools: {why_tool}; reasoning: {why_reasoning}")
