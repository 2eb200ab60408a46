"""Tool-call formats of the popular open model families, one module per family.

Each parser reads one model family's own markup (see each module's doc) with
the shared streaming rules of ``section.SectionToolParser``; the Hermes/Qwen
parser predates it and lives in ``gateway.parsers.hermes`` with the same rules.
"""

from gateway.parsers.hermes import HermesToolParser
from gateway.parsers.tool_calls.deepseek import (
    DeepSeekV3ToolParser,
    DeepSeekV31ToolParser,
    DeepSeekV32ToolParser,
)
from gateway.parsers.tool_calls.harmony import HarmonyToolParser
from gateway.parsers.tool_calls.kimi import KimiK2ToolParser
from gateway.parsers.tool_calls.llama import JsonToolParser, LlamaJsonToolParser
from gateway.parsers.tool_calls.mistral import MistralToolParser
from gateway.parsers.tool_calls.passthrough import PassthroughToolParser
from gateway.parsers.tool_calls.pythonic import PythonicToolParser
from gateway.parsers.tool_calls.section import SectionToolParser
from gateway.parsers.tool_calls.xml_params import (
    Glm45ToolParser,
    Glm47ToolParser,
    MiniMaxM2ToolParser,
    Qwen3CoderToolParser,
)

__all__ = [
    "DeepSeekV3ToolParser",
    "DeepSeekV31ToolParser",
    "DeepSeekV32ToolParser",
    "Glm45ToolParser",
    "Glm47ToolParser",
    "HarmonyToolParser",
    "HermesToolParser",
    "JsonToolParser",
    "KimiK2ToolParser",
    "LlamaJsonToolParser",
    "MiniMaxM2ToolParser",
    "MistralToolParser",
    "PassthroughToolParser",
    "PythonicToolParser",
    "Qwen3CoderToolParser",
    "SectionToolParser",
]
