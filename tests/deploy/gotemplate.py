"""A minimal Go text/template renderer for the Helm chart's templates (no helm binary here).

It knows exactly the subset the chart uses, and refuses anything else loudly:
``{{ .Values.x }}``, ``.Release``/``.Chart`` fields, ``define``/``include``,
``if``/``else``/``end``, whitespace trimming (``{{-`` / ``-}}``), pipelines, and the
functions ``include nindent indent toYaml quote default required printf trunc
trimSuffix not``. A reference to a value missing from values.yaml is an error
(Helm would render it empty), so the test also proves every reference exists.
"""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass, field
from typing import Any

import yaml

ACTION = re.compile(r"\{\{(-?)\s*(.*?)\s*(-?)\}\}", re.S)


class TemplateError(Exception):
    pass


class Missing(TemplateError):
    pass


@dataclass
class Node:
    kind: str  # text | action | if | define
    value: str = ""
    body: list[Node] = field(default_factory=list)
    orelse: list[Node] = field(default_factory=list)


def _lex(src: str) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    pos = 0
    for m in ACTION.finditer(src):
        text = src[pos:m.start()]
        if m.group(1):
            text = text.rstrip()
        out.append(("text", text))
        out.append(("action", m.group(2)))
        pos = m.end()
        if m.group(3):
            rest = src[pos:]
            pos += len(rest) - len(rest.lstrip())
    out.append(("text", src[pos:]))
    return out


def parse(src: str) -> tuple[list[Node], dict[str, list[Node]]]:
    defines: dict[str, list[Node]] = {}
    root: list[Node] = []
    stack: list[tuple[Node | None, list[Node]]] = [(None, root)]
    for kind, value in _lex(src):
        current = stack[-1][1]
        if kind == "text":
            if value:
                current.append(Node("text", value))
            continue
        if value.startswith("/*"):
            continue
        word, _, rest = value.partition(" ")
        if word == "if":
            node = Node("if", rest)
            current.append(node)
            stack.append((node, node.body))
        elif word == "define":
            node = Node("define", json.loads(rest))
            stack.append((node, node.body))
        elif word == "else":
            owner = stack[-1][0]
            if owner is None or owner.kind != "if":
                raise TemplateError("else outside if")
            stack[-1] = (owner, owner.orelse)
        elif word == "end":
            owner, _ = stack.pop()
            if owner is None:
                raise TemplateError("end without block")
            if owner.kind == "define":
                defines[owner.value] = owner.body
        elif word in ("range", "with", "template", "block", "tpl"):
            raise TemplateError(f"the mini renderer does not support {word!r}")
        else:
            current.append(Node("action", value))
    if len(stack) != 1:
        raise TemplateError("unclosed block")
    return root, defines


def truthy(v: Any) -> bool:
    return bool(v) if not isinstance(v, int | float) or isinstance(v, bool) else v != 0


def to_yaml(v: Any) -> str:
    if v in ({}, [], None):
        return {dict: "{}", list: "[]"}.get(type(v), "null")
    return yaml.safe_dump(v, default_flow_style=False, sort_keys=False).rstrip("\n")


class Renderer:
    def __init__(self, files: dict[str, str], values: dict[str, Any], release: dict[str, Any], chart: dict[str, Any]) -> None:
        self.defines: dict[str, list[Node]] = {}
        self.trees: dict[str, list[Node]] = {}
        for name, src in files.items():
            tree, defs = parse(src)
            self.defines.update(defs)
            self.trees[name] = tree
        self.root = {"Values": values, "Release": release, "Chart": chart}

    def render(self, name: str) -> str:
        return self._nodes(self.trees[name], self.root)

    def _nodes(self, nodes: list[Node], dot: Any) -> str:
        out = []
        for n in nodes:
            if n.kind == "text":
                out.append(n.value)
            elif n.kind == "action":
                v = self._pipeline(n.value, dot)
                out.append("" if v is None else str(v) if not isinstance(v, bool) else str(v).lower())
            elif n.kind == "if":
                out.append(self._nodes(n.body if truthy(self._pipeline(n.value, dot)) else n.orelse, dot))
        return "".join(out)

    def _term(self, tok: str, dot: Any) -> Any:
        if tok.startswith('"'):
            return json.loads(tok)
        if re.fullmatch(r"-?\d+", tok):
            return int(tok)
        if tok in ("true", "false"):
            return tok == "true"
        if tok == ".":
            return dot
        if tok.startswith("."):
            v = dot
            seen = ""
            for part in tok[1:].split("."):
                seen += "." + part
                if not isinstance(v, dict) or part not in v:
                    raise Missing(f"{seen} is not defined (values.yaml, Release or Chart)")
                v = v[part]
            return v
        raise TemplateError(f"unknown term {tok!r}")

    def _call(self, fn: str, args: list[Any]) -> Any:
        if fn == "include":
            return self._nodes(self.defines[args[0]], args[1])
        if fn == "nindent":
            return "\n" + self._call("indent", args)
        if fn == "indent":
            pad = " " * args[0]
            return "\n".join(pad + line if line else line for line in str(args[1]).split("\n"))
        if fn == "toYaml":
            return to_yaml(args[0])
        if fn == "quote":
            return json.dumps("" if args[0] is None else str(args[0]))
        if fn == "default":
            return args[1] if truthy(args[1]) else args[0]
        if fn == "required":
            if not truthy(args[1]):
                raise TemplateError(args[0])
            return args[1]
        if fn == "printf":
            return args[0].replace("%s", "{}").format(*args[1:])
        if fn == "trunc":
            return str(args[1])[: args[0]]
        if fn == "trimSuffix":
            return args[1][: -len(args[0])] if args[1].endswith(args[0]) else args[1]
        if fn == "not":
            return not truthy(args[0])
        raise TemplateError(f"the mini renderer does not support function {fn!r}")

    def _pipeline(self, text: str, dot: Any) -> Any:
        value: Any = None
        for i, command in enumerate(c.strip() for c in _split_pipes(text)):
            toks = shlex.split(command, posix=False)
            head = toks[0]
            if head.startswith(('"', ".")) or head in ("true", "false") or re.fullmatch(r"-?\d+", head):
                if len(toks) != 1 or i:
                    raise TemplateError(f"cannot evaluate {command!r}")
                value = self._term(head, dot)
                continue
            args = [self._term(t, dot) for t in toks[1:]]
            if i:
                args.append(value)
            value = self._call(head, args)
        return value


def _split_pipes(text: str) -> list[str]:
    parts, cur, quoted = [], "", False
    for ch in text:
        if ch == '"':
            quoted = not quoted
        if ch == "|" and not quoted:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    parts.append(cur)
    return parts
