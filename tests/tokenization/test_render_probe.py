"""The probe's symbolic texts: observations recorded with their answers, flows kept as
parts, everything else refused; variants replay only on the same answers."""

from __future__ import annotations

import operator
from typing import Any

import pytest
from jinja2.runtime import Undefined
from jinja2.utils import Namespace

from gateway.tokenization import ChatTemplate, render_budget
from gateway.tokenization.render_probe import (
    Derived,
    NotMemoizable,
    Piece,
    ProbeTemplate,
    Recorder,
    Sym,
    Variant,
    concat,
    holds_sym,
    resolve,
)


def _sym(text: str = "Hello", index: int = 0) -> tuple[Sym, Recorder]:
    recorder = Recorder()
    return Sym((index,), text, recorder), recorder


def test_observations_answer_from_the_real_text_and_are_recorded() -> None:
    sym, recorder = _sym("Hello")
    assert sym == "Hello" and "ell" in sym and len(sym) == 5 and bool(sym)
    assert sym.method("startswith")("He") is True and sym.method("count")("l") == 2
    assert "Hello" == sym and sym < "z"  # reflected comparisons are the Sym's own
    answers = [(ref, fn, args, answer) for ref, fn, args, answer in recorder.looks]
    assert answers[0] == (0, operator.eq, ("Hello",), True)
    assert [a[3] for a in answers] == [True, True, 5, True, True, 2, True, True]


def test_flows_keep_their_parts() -> None:
    sym, _ = _sym("Hi", 1)
    made = "<" + sym + ">"
    assert isinstance(made, Sym) and made.parts == ("<", 1, ">") and made.value == "<Hi>"
    stripped = (sym + "  ").method("rstrip")()
    assert stripped.parts == (Derived((1, "  "), "rstrip", ()),) and stripped.value == "Hi"
    assert resolve(stripped.parts, ["", " yo "]) == " yo"


@pytest.mark.parametrize(
    "use",
    [hash, iter, str, repr, int, float, lambda s: s[0], lambda s: s * 2, lambda s: f"{s}", lambda s: s.split,
     lambda s: s.method("split"), lambda s: s + 1, lambda s: 1 + s, lambda s: s == s, lambda s: s in "abc",
     lambda s: s.method("startswith")(s), lambda s: s.method("strip")(chars=" ")],
)
def test_every_other_use_is_refused(use: Any) -> None:
    sym, _ = _sym()
    with pytest.raises((NotMemoizable, TypeError)):
        use(sym)


def test_holds_sym_looks_into_containers_and_refuses_what_it_cannot_see() -> None:
    sym, _ = _sym()
    assert holds_sym([{"a": (1, sym)}]) and not holds_sym([{"a": (1, "x")}, None, 2.5])
    assert holds_sym(Namespace(x=sym)) and not holds_sym(Namespace(x=1))
    assert holds_sym(iter([1])) and holds_sym(object())
    assert not holds_sym(Undefined()) and not holds_sym(len) and not holds_sym(slice(None, None, -1))


def test_a_buffer_holding_a_written_sym_joins_into_a_sym() -> None:
    sym, _ = _sym("mid", 2)
    written = "<" + sym
    piece = Piece(written.value)
    piece.sym = written
    joined = concat(["a", piece, "b"])
    assert isinstance(joined, Sym) and joined.parts == ("a", "<", 2, "b") and joined.value == "a<midb"
    assert concat(["a", "b"]) == "ab" and type(concat(["a"])) is str
    assert str(piece) is piece  # written out by the template's str() as it is


def _variant(looks: tuple[Any, ...] = (), growth: tuple[Any, ...] = ()) -> Variant:
    pieces = ("{x}", 0, Derived((1,), "strip", ()), "}")
    return Variant(looks=looks, pieces=pieces, fmt=None, fixed_bytes=10, fixed_work=10, growth=growth)


def test_a_variant_replays_on_the_same_answers_only() -> None:
    variant = _variant(looks=((0, str.startswith, ("a",), True), ((0, "!"), operator.eq, ("ab!",), True)))
    assert variant.render(["ab", " c "]) == "{x}abc}"
    assert variant.render(["b", " c "]) is None
    assert variant.render(["ax", " c "]) is None


def test_a_variant_refuses_contents_that_could_pass_the_base_budget() -> None:
    variant = _variant(growth=((0, 8, 1, 2),))
    assert variant.render(["x" * 1000, ""]) is not None
    assert variant.render(["x" * (render_budget.BASE_BYTES // 8 + 10), ""]) is None


def _probe(source: str) -> ProbeTemplate:
    template = ChatTemplate(source, memo=False)
    return ProbeTemplate(source, template._environment())


def test_a_probe_gives_pieces_that_reproduce_the_render() -> None:
    source = "{% for m in messages %}{{ '{<' + m.role + '>' + m.content.strip() + '}' }}{% endfor %}!"
    probe = _probe(source)
    messages: list[dict[str, Any]] = [{"role": "user", "content": ...}, {"role": "bot", "content": ...}]
    variant = probe.probe([" a ", "{0}"], {"messages": messages}, "{<user>a}{<bot>{0}}!")
    assert variant is not None
    assert variant.render(["x", " y"]) == "{<user>x}{<bot>y}!"


def test_a_probe_refuses_what_it_cannot_follow() -> None:
    assert _probe("{% for m in messages %}{{ m.content ~ '' }}{% endfor %}").probe(
        ["a"], {"messages": [{"role": "user", "content": ...}]}, "a") is None  # fmt: skip
    with pytest.raises(NotImplementedError):
        _probe("{% block b %}{{ messages }}{% endblock %}")


def test_a_macro_and_a_set_block_carry_contents_symbolically() -> None:
    source = (
        "{% macro show(x) %}[{{ x.strip() }}]{% endmacro %}"
        "{% for m in messages %}{% set body %}{{ show(m.content) }}{% endset %}{{ body|length }}{{ body }}{% endfor %}"
    )
    variant = _probe(source).probe([" a "], {"messages": [{"role": "user", "content": ...}]}, "3[a]")
    assert variant is not None
    assert variant.render([" b "]) == "3[b]"
    assert variant.render([" bc "]) is None  # its length was looked at
