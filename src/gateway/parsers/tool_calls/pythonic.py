"""Pythonic tool calls: ``[get_weather(city="Paris"), get_time(zone="CET")]``.

Llama 4 (and Llama 3.2's pythonic template, ToolACE, some fine-tunes) write a
Python list of calls with keyword arguments, Llama 4 optionally between
``<|python_start|>`` and ``<|python_end|>``. The list is split into calls with
Python's own tokenizer (``tokenize``, which knows strings and brackets) and each
finished call is read with ``ast``: keyword values must be literals; JSON's
``true``/``false``/``null`` are accepted as well, since models write them.
A call's arguments are sent whole once the call closes.
"""

from __future__ import annotations

import ast
import io
import json
import tokenize
from typing import Any

from gateway.parsers.tool_calls.section import CallView, SectionToolParser, SectionView

PYTHON_START = "<|python_start|>"
PYTHON_END = "<|python_end|>"
_JSON_NAMES = {"true": True, "false": False, "null": None}
_STRUCTURE = frozenset("()[]{},='\"<>|\n")


def _literal(node: ast.expr) -> Any:
    if isinstance(node, ast.Name) and node.id in _JSON_NAMES:
        return _JSON_NAMES[node.id]
    if isinstance(node, ast.List | ast.Tuple):
        return [_literal(e) for e in node.elts]
    if isinstance(node, ast.Dict):
        return {_literal(k): _literal(v) for k, v in zip(node.keys, node.values, strict=True) if k is not None}
    value = ast.literal_eval(node)
    if isinstance(value, tuple | set):
        return list(value)
    return value


def _dotted(node: ast.expr) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return _dotted(node.value) + "." + node.attr
    raise ValueError("call target is not a name")


def read_call(source: str) -> tuple[str, str]:
    """``(name, arguments JSON)`` of one ``f(a=1, ...)`` call; ValueError otherwise."""
    try:
        node = ast.parse(source.strip(), mode="eval").body
    except SyntaxError as exc:
        raise ValueError(str(exc)) from None
    if not isinstance(node, ast.Call) or node.args:
        raise ValueError("not a call with keyword arguments")
    args: dict[str, Any] = {}
    for kw in node.keywords:
        if kw.arg is None:
            raise ValueError("**kwargs in a call")
        args[kw.arg] = _literal(kw.value)
    return _dotted(node.func), json.dumps(args, ensure_ascii=False)


def _lines_offsets(text: str) -> list[int]:
    offsets = [0]
    for line in text.splitlines(keepends=True):
        offsets.append(offsets[-1] + len(line))
    return offsets


class PythonicToolParser(SectionToolParser):
    markers = (PYTHON_START,)
    start_markers = ("[",)
    needs_special_tokens = True
    structure_chars = _STRUCTURE

    def scan(self, section: str, *, final: bool) -> SectionView:
        base = len(PYTHON_START) if section.startswith(PYTHON_START) else 0
        body = section[base:]
        view = SectionView(status="incomplete")
        offsets = _lines_offsets(body)
        depth = 0
        call_start: int | None = None
        expect_call = True
        pending_name: list[str] = []
        started = False
        try:
            for tok in tokenize.generate_tokens(io.StringIO(body).readline):
                if tok.type in (tokenize.NL, tokenize.NEWLINE, tokenize.COMMENT, tokenize.INDENT, tokenize.DEDENT, tokenize.ENDMARKER):
                    if tok.type == tokenize.ENDMARKER:
                        break
                    continue
                if tok.type == tokenize.ERRORTOKEN and tok.string.strip() in ("'", '"'):
                    break  # a string that has not been closed yet
                pos = offsets[tok.start[0] - 1] + tok.start[1]
                end = offsets[tok.end[0] - 1] + tok.end[1]
                if not started:
                    if tok.string != "[":
                        return SectionView(status="invalid")
                    started, depth = True, 1
                    continue
                if depth == 1:
                    if tok.string == "]":
                        if expect_call and view.calls:
                            return SectionView(status="invalid")
                        stop = base + end
                        rest = section[stop:]
                        if rest.lstrip().startswith(PYTHON_END):
                            stop += len(rest) - len(rest.lstrip()) + len(PYTHON_END)
                        elif base and not final and PYTHON_END.startswith(rest.lstrip()):
                            return view
                        view.status, view.end = "complete", stop
                        return view
                    if tok.string == ",":
                        if expect_call:
                            return SectionView(status="invalid")
                        expect_call = True
                        continue
                    if not expect_call and call_start is None:
                        return SectionView(status="invalid")
                    if call_start is None:
                        if tok.type != tokenize.NAME:
                            return SectionView(status="invalid")
                        call_start = pos
                        pending_name = [tok.string]
                        continue
                    if tok.string == ".":
                        continue
                    if tok.type == tokenize.NAME:
                        pending_name.append(tok.string)
                        continue
                    if tok.string != "(":
                        return SectionView(status="invalid")
                    depth = 2
                    view.calls.append(CallView(name=".".join(pending_name)))
                    continue
                if tok.string in "([{" and tok.type == tokenize.OP:
                    depth += 1
                elif tok.string in ")]}" and tok.type == tokenize.OP:
                    depth -= 1
                    if depth == 1:
                        assert call_start is not None
                        try:
                            name, args = read_call(body[call_start:end])
                        except ValueError:
                            return SectionView(status="invalid")
                        view.calls[-1] = CallView(name=name, arguments=args, done=True)
                        call_start = None
                        expect_call = False
        except (tokenize.TokenError, SyntaxError, IndentationError):
            pass  # the text stops inside a bracket or a string
        if final:
            return SectionView(status="invalid")
        if not started and body.strip():
            return SectionView(status="invalid")
        # An unfinished call's name may still grow into something else: announce names
        # only for calls whose "(" was seen (their name is complete by then).
        return view
