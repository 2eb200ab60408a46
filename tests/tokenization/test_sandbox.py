"""The memoized sandbox answers exactly as jinja2's ImmutableSandboxedEnvironment does."""

from __future__ import annotations

import copy
from collections import deque
from typing import Any

import jinja2
import pytest
from hypothesis import given
from hypothesis import strategies as st
from jinja2.runtime import LoopContext
from jinja2.sandbox import ImmutableSandboxedEnvironment, SandboxedEnvironment
from transformers.utils import chat_template_utils

from gateway.tokenization import Tokenizer
from gateway.tokenization.chat_template import ChatTemplate, normalize_messages
from gateway.tokenization.sandbox import PlainMemoSandbox, memoize_plain_verdicts

from .helpers import PROPERTY
from .test_chat_template import _CONVERSATIONS, _templates

SAMPLES: list[Any] = [
    {}, {"content": "x", "role": "user", "items": 1, "clear": 2, "__class__": 3, "format": 4}, [], [1, "a"],
    "", "text {0}", 0, 7, -1, 2.5, True, False, None,
]  # fmt: skip
NAMES = sorted(
    {n for s in SAMPLES for n in dir(s)}
    | {"content", "role", "items", "clear", "format", "format_map", "mro", "missing", "gi_frame", "__globals__", ""}
)


def _fresh(source: str) -> jinja2.Template:
    """The template compiled by transformers into a sandbox of its own, not memoized."""
    template = chat_template_utils._cached_compile_jinja_template(source)
    assert type(template.environment) is ImmutableSandboxedEnvironment
    return template


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, jinja2.Undefined) or isinstance(b, jinja2.Undefined):
        return (
            type(a) is type(b) and a._undefined_hint == b._undefined_hint  # type: ignore[union-attr]
            and a._undefined_exception is b._undefined_exception  # type: ignore[union-attr]
            and a._undefined_name == b._undefined_name  # type: ignore[union-attr]
        )  # fmt: skip
    if getattr(a, "__name__", None) in ("format", "format_map") and callable(a):
        return callable(b) and a.__wrapped__ == b.__wrapped__  # both sandboxed wrappers of the same method
    return bool(a is b or a == b)


@pytest.fixture(scope="module")
def envs() -> tuple[ImmutableSandboxedEnvironment, PlainMemoSandbox]:
    jinja_env = _fresh("{{ x }}").environment
    memo = _fresh("{{ x }}").environment
    assert memoize_plain_verdicts(memo) and type(memo) is PlainMemoSandbox
    return jinja_env, memo  # type: ignore[return-value]


def test_every_attribute_of_plain_data_gets_jinjas_answer(envs: tuple[Any, Any]) -> None:
    jinja_env, memo = envs
    for _ in range(2):  # first computed, then memoized
        for obj in SAMPLES:
            for name in NAMES:
                assert _same(memo.getattr(obj, name), jinja_env.getattr(obj, name)), (obj, name)


def test_unsafe_attributes_stay_unsafe(envs: tuple[Any, Any]) -> None:
    _, memo = envs
    for obj, name in [({}, "clear"), ([], "append"), ({}, "update"), ([], "pop"), ("", "__class__"), (1, "__class__")]:
        for _ in range(2):
            found = memo.getattr(obj, name)
            assert isinstance(found, jinja2.Undefined), (obj, name)
            with pytest.raises(jinja2.exceptions.SecurityError):
                found()  # calling it (or reading from it) raises the sandbox's refusal


def test_loop_and_namespace_attributes_get_jinjas_answer(envs: tuple[Any, Any]) -> None:
    jinja_env, memo = envs
    loop = LoopContext(iter([1, 2]), jinja_env.undefined)
    namespace = memo.globals["namespace"](a=1, f="{0.__class__}".format, s="t")
    names = [*dir(loop), *dir(namespace), "a", "f", "s", "missing", "__class__", "_Namespace__attrs"]
    for _ in range(2):
        for obj in (loop, namespace, jinja2.utils.Namespace(b=2)):
            for name in names:
                assert _same(memo.getattr(obj, name), jinja_env.getattr(obj, name)), (obj, name)
    wrapped = memo.getattr(namespace, "f")  # a str.format stored in a namespace is still sandboxed
    assert wrapped(1) == jinja_env.getattr(namespace, "f")(1) == ""  # unsandboxed it would print the class


ESCAPES = [
    "{{ ''.__class__.__mro__ }}",
    "{{ messages.append(1) }}{{ messages }}",
    "{{ messages[0].update({'role': 'x'}) }}",
    "{{ messages[0].clear() }}",
    "{{ '{0.__class__}'.format(1) }}",
    "{{ '{x.__class__}{x.real}'.format_map({'x': 1}) }}",
    "{% set f = ''.format %}{{ f('{0.__class__.__base__}', 1) }}",
    "{% set ns = namespace(f='{0.__class__}'.format) %}{{ ns.f(1) }}",
    "{% set ns = namespace(a=1) %}{{ ns.__init__ }}",
    "{% for m in messages %}{{ loop.__class__ }}{{ loop.__init__.__globals__ }}{% endfor %}",
    "{{ messages[0].content.__class__ }}",
    "{{ (1).__class__.__subclasses__() }}",
    "{{ raise_exception.__globals__ }}",
    "{{ dict.__class__ }}",
    "{{ messages|attr('__class__') }}",
    "{{ messages[0]|attr('clear') }}",
    "{{ messages[0].content.split(' ') }}{{ messages[0].role.upper() }}{{ messages[0].items() | list }}",
    "{% set ns = namespace(n=0) %}{% for m in messages %}{% set ns.n = ns.n + loop.index %}{% endfor %}{{ ns.n }}",
]


@pytest.mark.parametrize("source", ESCAPES)
def test_templates_that_try_the_sandbox_meet_the_same_answer(source: str) -> None:
    messages = [{"role": "user", "content": "a b"}, {"role": "assistant", "content": "c"}]
    outcomes = []
    for memoized in (False, True):
        template = _fresh(source)
        if memoized:
            assert memoize_plain_verdicts(template.environment)
        try:
            outcomes.append(("ok", template.render(messages=copy.deepcopy(messages))))
        except Exception as exc:  # the sandbox's refusal: the same exception, the same words
            outcomes.append((type(exc).__name__, str(exc)))
    assert outcomes[0] == outcomes[1]


def test_other_environments_are_left_alone() -> None:
    assert not memoize_plain_verdicts(SandboxedEnvironment())  # not immutable: its verdicts differ
    assert not memoize_plain_verdicts(jinja2.Environment())

    class Custom(ImmutableSandboxedEnvironment):
        def is_safe_attribute(self, obj: Any, attr: str, value: Any) -> bool:
            return isinstance(value, str)

    assert not memoize_plain_verdicts(Custom())


def test_chat_templates_render_in_the_memoized_sandbox(qwen: Tokenizer) -> None:
    template = qwen.chat_template()
    assert type(template._compiled.environment) is PlainMemoSandbox


@pytest.mark.parametrize("case", range(len(_CONVERSATIONS)))
def test_every_fixture_template_renders_as_in_jinjas_sandbox(qwen: Tokenizer, case: int) -> None:
    messages, options = _CONVERSATIONS[case]
    for name, template in _templates(qwen).items():
        _compare(template, messages, options, name)


def _compare(template: ChatTemplate, messages: list[dict[str, Any]], options: dict[str, Any], name: str = "") -> None:
    reference = _fresh(template.source)
    options = copy.deepcopy(options)
    kwargs = options.pop("chat_template_kwargs", None) or {}
    conversation = normalize_messages(
        copy.deepcopy(messages), template.content_format,
        arguments_text=template.arguments_as_text, content_null_aware=template.content_null_aware,
    )  # fmt: skip
    for generation in (True, False):
        call = {
            "messages": chat_template_utils._alias_reasoning_fields(conversation), "add_generation_prompt": generation,
            **{k: v for k, v in options.items() if k != "add_generation_prompt"}, **template.special_tokens, **kwargs,
        }  # fmt: skip
        outcomes = []
        for compiled in (reference, template._compiled):
            try:
                outcomes.append(compiled.render(**copy.deepcopy(call)))
            except Exception as exc:
                outcomes.append(f"{type(exc).__name__}: {exc}")
        assert outcomes[0] == outcomes[1], (name, generation)


_TEXT = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=30)


@PROPERTY
@given(
    turns=st.lists(
        st.tuples(st.sampled_from(["user", "assistant", "system", "tool"]), _TEXT, st.none() | _TEXT),
        min_size=1, max_size=5,
    ),
    thinking=st.booleans(),
)  # fmt: skip
def test_qwen3_renders_any_conversation_as_in_jinjas_sandbox(
    qwen: Tokenizer, turns: list[tuple[str, str, str | None]], thinking: bool
) -> None:
    messages = [{"role": r, "content": c, **({"reasoning_content": rc} if rc is not None else {})} for r, c, rc in turns]
    _compare(qwen.chat_template(), messages, {"chat_template_kwargs": {"enable_thinking": thinking}})


def test_deque_and_sets_are_not_plain(envs: tuple[Any, Any]) -> None:
    jinja_env, memo = envs
    for obj in (deque([1]), {1}, frozenset({1})):
        for name in ("append", "add", "clear", "pop", "copy"):
            assert _same(memo.getattr(obj, name), jinja_env.getattr(obj, name))
