#!/usr/bin/env python
"""CPU per streamed delta of every tool-call parser (no network, no server).

    token-gateway bench parsers             # default sizes
    token-gateway bench parsers --chars 50000 --step 4

For each format: one call whose single string argument is ``--chars`` long, fed
``--step`` characters per delta (about one token), then ``--chars`` of plain
text with no call. Reports process CPU time per delta (robust on a shared
machine) and the ratio of the long call's cost per delta to a call ten times
shorter: about 1 means streaming cost stays linear in the call's length.
"""

from __future__ import annotations

import argparse
import time

from gateway.parsers.registry import get_tool_parser
from gateway_lab.bench import results

FORMATS = {
    "hermes": '<tool_call>\n{{"name": "write", "arguments": {{"text": "{x}"}}}}\n</tool_call>',
    "qwen3_coder": "<tool_call>\n<function=write>\n<parameter=text>\n{x}\n</parameter>\n</function>\n</tool_call>",
    "llama3": '<|python_tag|>{{"name": "write", "parameters": {{"text": "{x}"}}}}',
    "pythonic": '[write(text="{x}")]',
    "mistral": '[TOOL_CALLS]write[ARGS]{{"text": "{x}"}}',
    "deepseekv3": '<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>write\n```json\n{{"text": "{x}"}}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>',
    "deepseekv31": '<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>write<｜tool▁sep｜>{{"text": "{x}"}}<｜tool▁call▁end｜><｜tool▁calls▁end｜>',
    "deepseekv32": '<｜DSML｜function_calls>\n<｜DSML｜invoke name="write">\n<｜DSML｜parameter name="text" string="true">{x}</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜function_calls>',
    "kimi_k2": '<|tool_calls_section_begin|><|tool_call_begin|>functions.write:0<|tool_call_argument_begin|>{{"text": "{x}"}}<|tool_call_end|><|tool_calls_section_end|>',
    "glm45": "<tool_call>write\n<arg_key>text</arg_key>\n<arg_value>{x}</arg_value>\n</tool_call>",
    "minimax-m2": '<minimax:tool_call>\n<invoke name="write">\n<parameter name="text">{x}</parameter>\n</invoke>\n</minimax:tool_call>',
    "gpt-oss": '<|channel|>commentary to=functions.write <|constrain|>json<|message|>{{"text": "{x}"}}<|call|>',
}


# The tool's schema types "text" as a string: XML-style formats then stream it as it grows.
TOOLS = [{"type": "function", "function": {"name": "write", "parameters": {"type": "object", "properties": {"text": {"type": "string"}}}}}]


def cpu_per_delta(name: str, text: str, step: int) -> float:
    pieces = [text[i : i + step] for i in range(0, len(text), step)]
    parser = get_tool_parser(name, tools=TOOLS)
    started = time.process_time()
    for piece in pieces:
        parser.feed(piece)
    parser.finish()
    return (time.process_time() - started) / len(pieces)


def add_arguments(ap: argparse.ArgumentParser) -> None:
    """The scenario's flags (``token-gateway bench NAME --help``)."""
    ap.add_argument("--chars", type=int, default=20_000, help="length of the long argument")
    ap.add_argument("--step", type=int, default=4, help="characters per delta")
    ap.add_argument("--json", default="", help="also write the results here as JSON")
    ap.add_argument("--markdown", default="", help="also write the table here as Markdown")


HEADER = ("format", "long call µs/delta", "short call µs/delta", "long/short", "plain text µs/delta")


def main(args: argparse.Namespace) -> int | None:
    """Run the scenario with parsed flags; the exit status."""
    words = ("lorem ipsum dolor sit amet " * (args.chars // 27 + 1))[: args.chars]
    rows, data = [], []
    for name, template in FORMATS.items():
        long = cpu_per_delta(name, template.format(x=words), args.step)
        short = cpu_per_delta(name, template.format(x=words[: args.chars // 10]), args.step)
        plain = cpu_per_delta(name, words, args.step)
        rows.append((name, f"{long * 1e6:.1f}", f"{short * 1e6:.1f}", f"{long / short:.2f}", f"{plain * 1e6:.1f}"))
        data.append({"format": name, "long_s_per_delta": long, "short_s_per_delta": short, "plain_s_per_delta": plain})
    table = results.Table.of(f"CPU per delta: a {args.chars}-character argument, {args.step} per delta", HEADER, rows, labels=1)
    out = results.Result(tables=[table], data={"chars": args.chars, "step": args.step, "formats": data})
    return results.write(out, json_path=args.json, markdown_path=args.markdown)
