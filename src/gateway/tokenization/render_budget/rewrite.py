"""The tree rewrite: a parsed template changed in place so every check of ``checks`` is
called where it applies (outputs, stores, loops, literals that hold computed values,
``*``, ``**``, ``%``, ``in``), nothing is left for jinja2 to fold at compile time.
"""

from __future__ import annotations

from collections.abc import Sequence

from jinja2 import nodes

from gateway.tokenization.render_budget.checks import (
    GROW,
    KEEP,
    LOOP,
    MADE,
    MOD,
    MUL,
    OUT,
    POW,
    SCAN,
)

_BINOPS: dict[type[nodes.BinExpr], str] = {nodes.Mul: MUL, nodes.Pow: POW, nodes.Mod: MOD}


def _check(node: nodes.Node, name: str, *args: nodes.Expr) -> nodes.Filter:
    return nodes.Filter(node, name, list(args), [], None, None, lineno=node.lineno)


def _literal_chars(body: Sequence[nodes.Node]) -> int:
    """The most literal text a loop body can write per iteration: the template data and
    constant strings of its outputs, every branch counted (nested loops charge their own;
    computed outputs are charged as they are written)."""
    total = 0
    stack: list[nodes.Node] = list(body)
    while stack:
        node = stack.pop()
        if isinstance(node, nodes.Output):
            for child in node.nodes:
                if isinstance(child, nodes.TemplateData):
                    total += len(child.data)
                elif isinstance(child, nodes.Const) and isinstance(child.value, str):
                    total += len(child.value)
        elif isinstance(node, nodes.Stmt) and not isinstance(node, nodes.For | nodes.Macro):
            stack.extend(node.iter_child_nodes())
    return total


# Methods and filters whose result is never larger than what they are given.
_SHRINKING = frozenset({
    "strip", "lstrip", "rstrip", "split", "rsplit", "splitlines", "lower", "upper", "title", "capitalize",
    "startswith", "endswith", "removeprefix", "removesuffix", "count", "find", "rfind", "index", "get", "keys",
    "values", "items", "length", "int", "float", "abs", "round", "trim", "first", "last", "default", "d", "e",
    "bool", "wordcount", "truncate", "striptags",
})  # fmt: skip


def _refers(node: nodes.Node) -> bool:
    """True when storing the expression's value cannot grow anything across a loop: it picks
    existing values (a name, an item, an attribute, a slice), computes a number or a test,
    or calls a method or filter whose result is no larger than its inputs. (``string`` and
    ``tojson`` are no larger than the value's weight, which ``_made`` bounds.)"""
    if isinstance(node, nodes.Const | nodes.Name | nodes.Not | nodes.Compare | nodes.Test):
        return True
    if isinstance(node, nodes.Getattr):
        return _refers(node.node)
    if isinstance(node, nodes.Getitem):
        return _refers(node.node) and (isinstance(node.arg, nodes.Slice) or _refers(node.arg))
    if isinstance(node, nodes.And | nodes.Or):
        return _refers(node.left) and _refers(node.right)
    if isinstance(node, nodes.Sub | nodes.Div | nodes.FloorDiv | nodes.Neg | nodes.Pos):
        return True  # numbers only: str and list have no such operators
    if isinstance(node, nodes.CondExpr):
        return _refers(node.expr1) and (node.expr2 is None or _refers(node.expr2))
    if isinstance(node, nodes.Filter):
        return node.name in _SHRINKING and node.node is not None and _refers(node.node) and all(
            _refers(a) for a in node.args)
    if isinstance(node, nodes.Call) and isinstance(node.node, nodes.Getattr):
        return node.node.attr in _SHRINKING and _refers(node.node.node) and all(_refers(a) for a in node.args)
    return False


class _Rewriter:
    """Rewrites a parsed template in place so every check above is called where it applies."""

    def visit(self, node: nodes.Node) -> nodes.Node:
        for field, old in node.iter_fields():
            if isinstance(old, list):
                setattr(node, field, [self.visit(n) if isinstance(n, nodes.Node) else n for n in old])
            elif isinstance(old, nodes.Node):
                setattr(node, field, self.visit(old))
        return self._rewrite(node)

    def _rewrite(self, node: nodes.Node) -> nodes.Node:
        if isinstance(node, nodes.BinExpr) and type(node) in _BINOPS:
            return _check(node.left, _BINOPS[type(node)], node.right)
        if isinstance(node, nodes.List | nodes.Dict) or (isinstance(node, nodes.Tuple) and node.ctx == "load"):
            items = [i.value if isinstance(i, nodes.Pair) else i for i in node.items]
            items += [i.key for i in node.items if isinstance(i, nodes.Pair)]
            if not all(isinstance(i, nodes.Const) for i in items):
                return _check(node, MADE)
        if isinstance(node, nodes.Operand) and node.op in ("in", "notin"):
            node.expr = _check(node.expr, SCAN)  # the container searched
        elif isinstance(node, nodes.Output):
            node.nodes = [n if isinstance(n, nodes.TemplateData | nodes.Const) else _check(n, OUT) for n in node.nodes]
        elif isinstance(node, nodes.For):
            node.iter = _check(node.iter, LOOP, nodes.Const(_literal_chars(node.body)))
        elif isinstance(node, nodes.Assign):
            if isinstance(node.target, nodes.NSRef) and not _refers(node.node):
                # a namespace attribute outlives the iteration: what it grows by is charged,
                # so an accumulator costs its final size and a doubling its final size too
                before = nodes.Getattr(nodes.Name(node.target.name, "load"), node.target.attr, "load")
                node.node = _check(node.node, GROW, before)
            elif not _refers(node.node):
                node.node = _check(node.node, KEEP)
        elif isinstance(node, nodes.With):
            node.values = [v if _refers(v) else _check(v, KEEP) for v in node.values]
        elif isinstance(node, nodes.EvalContextModifier):
            for option in node.options:  # never evaluated at compile time
                option.value = _check(option.value, KEEP)
        return node


def budgeted(template: nodes.Template) -> nodes.Template:
    """``template`` (parsed by a budgeted environment) rewritten with its checks."""
    rewritten = _Rewriter().visit(template)
    assert isinstance(rewritten, nodes.Template)
    return rewritten
