"""Chat-template rendering with transformers' ``apply_chat_template`` semantics.

The template is compiled in the environment ``transformers.utils.chat_template_utils``
builds (its sandboxed jinja environment with ``raise_exception``, ``tojson``,
``strftime_now``, ``namespace``, loopcontrols and ``{% generation %}``), so prompts are
byte-identical to what ``AutoTokenizer.apply_chat_template(..., tokenize=False)``
produces. Every render calls that compiled template directly with what transformers'
``render_jinja_template`` would pass it (everything the template sees rebuilt as plain
JSON data, reasoning fields aliased): the wrapper copies the messages a second time,
after our own copy, and that copy is on every request's critical path.

The template is a worker's code, so it is compiled with ``render_budget``'s checks and
without constant folding, and every render runs under a budget sized by the request: a
template bomb is ``ChatTemplateBudgetError`` within about a millisecond.

What this module adds is the OpenAI-request normalisation an inference server does
before calling the template (as SGLang does): content-part lists flattened for
templates that expect a string (a null content becomes ""), tool-call arguments sent
as JSON text parsed to objects, other ``None`` fields dropped, and every failure turned
into ``ChatTemplateError``.
"""

from __future__ import annotations

import copy
import json
import os
import re
from collections.abc import Mapping, Sequence
from typing import Any, Literal

import jinja2
import jinja2.nodes

from gateway.tokenization import render_budget
from gateway.tokenization.errors import ChatTemplateBudgetError, ChatTemplateError
from gateway.tokenization.render_budget import BudgetExceeded
from gateway.tokenization.render_memo import RenderMemo, Shape
from gateway.tokenization.sandbox import memoize_plain_verdicts

ContentFormat = Literal["string", "openai"]

# Arguments the template call itself owns; chat_template_kwargs may not override them.
_RESERVED_KWARGS = frozenset(
    {"messages", "tools", "documents", "add_generation_prompt", "continue_final_message"}
)
# What transformers appends to the final message to find where it ends in the render.
_CONTINUE_TAG = "CONTINUE_FINAL_MESSAGE_TAG "
# Loop variables under which templates iterate over a message's content parts.
_MESSAGE_NAMES = frozenset({"message", "msg", "m"})


def _load_renderer() -> Any:
    """Import transformers' renderer lazily: importing transformers costs about a second."""
    # transformers advises at import that PyTorch is missing: the gateway needs only its
    # template renderer, so the advice is noise on every start (an operator's own value wins).
    os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
    try:
        from transformers.utils import chat_template_utils
    except ImportError as exc:  # transformers is a runtime dependency; say so clearly
        raise ChatTemplateError(f"chat templates need transformers: {exc}") from exc
    return chat_template_utils


_SCALARS = (str, int, float, bool)


def plain(value: Any) -> Any:
    """``value`` rebuilt from plain JSON types, as transformers' ``_plain_template_data``
    rebuilds what a template may see (the sandbox does not know the methods of rich
    objects); plain dicts, lists and exact scalars are handled here, anything else by
    transformers' own function, so the result is always the one it would give."""
    kind = type(value)
    if value is None or kind in _SCALARS:
        return value
    if kind is dict:
        return {_plain_key(k): plain(v) for k, v in value.items()}
    if kind is list:
        return [plain(v) for v in value]
    rebuild = getattr(_load_renderer(), "_plain_template_data", None)
    return rebuild(value) if rebuild is not None else copy.deepcopy(value)  # older transformers: a copy


def _plain_key(key: Any) -> Any:
    return key if type(key) is str else plain(key)


def _is_content_access(node: jinja2.nodes.Node) -> bool:
    """True for ``message.content`` / ``message['content']`` (optionally piped through filters)."""
    while isinstance(node, jinja2.nodes.Filter) and node.node is not None:
        node = node.node
    if isinstance(node, jinja2.nodes.Getattr):
        target, attr = node.node, node.attr
    elif isinstance(node, jinja2.nodes.Getitem) and isinstance(node.arg, jinja2.nodes.Const):
        target, attr = node.node, node.arg.value
    else:
        return False
    return (
        attr == "content"
        and isinstance(target, jinja2.nodes.Name)
        and target.name in _MESSAGE_NAMES
    )


def detect_content_format(ast: jinja2.nodes.Template) -> ContentFormat:
    """``"openai"`` if the template loops over a message's content parts, else ``"string"``."""
    for loop in ast.find_all(jinja2.nodes.For):
        if _is_content_access(loop.iter):
            return "openai"
    return "string"


def _flatten_content(content: Any, where: str) -> str:
    """Join the text parts of an OpenAI content list with a space (as SGLang does)."""
    texts: list[str] = []
    for part in content:
        if not isinstance(part, Mapping):
            raise ChatTemplateError(f"{where}: content parts must be objects, got {part!r}")
        if part.get("type", "text") == "text":
            text = part.get("text")
            if not isinstance(text, str):
                raise ChatTemplateError(f"{where}: a text content part needs a string 'text'")
            texts.append(text)
    return " ".join(texts)


# A template that glues the arguments into a string with "+" (DeepSeek V3.1's, R1's)
# wants them as JSON text; the rest (Hugging Face convention, "| tojson") want objects.
_ARGUMENTS_CONCATENATED = re.compile(
    r"""\[\s*['"]arguments['"]\s*\]\s*\+|\+\s*[\w.]+(?:\[\s*['"]\w+['"]\s*\])*\[\s*['"]arguments['"]\s*\]"""
)


# A template that tests ``content is none`` renders tool-call turns only then (DeepSeek V3).
_CONTENT_IS_NONE = re.compile(r"""content['"]?\]?\s+is\s+none""")


def arguments_as_text(source: str) -> bool:
    """True when the template concatenates tool-call arguments as a string."""
    return _ARGUMENTS_CONCATENATED.search(source) is not None


def _normalize_tool_calls(tool_calls: Any, where: str, *, as_text: bool = False) -> Any:
    """Tool-call arguments arrive as JSON text from OpenAI clients; templates want objects
    (or, with ``as_text``, the JSON text itself)."""
    if not isinstance(tool_calls, list):
        raise ChatTemplateError(f"{where}: tool_calls must be a list")
    for i, call in enumerate(tool_calls):
        if not isinstance(call, dict):
            raise ChatTemplateError(f"{where}: tool_calls[{i}] must be an object")
        function = call.get("function", call)
        if not isinstance(function, dict):
            raise ChatTemplateError(f"{where}: tool_calls[{i}].function must be an object")
        arguments = function.get("arguments")
        if as_text:
            if not isinstance(arguments, str):
                function["arguments"] = json.dumps(arguments if arguments is not None else {}, ensure_ascii=False)
            continue
        if arguments is None or arguments == "":
            function["arguments"] = {}
        elif isinstance(arguments, str):
            try:
                function["arguments"] = json.loads(arguments)
            except ValueError as exc:
                raise ChatTemplateError(
                    f"{where}: tool_calls[{i}] arguments are not valid JSON: {exc}"
                ) from exc
    return tool_calls


def normalize_messages(
    messages: Sequence[Mapping[str, Any]],
    content_format: ContentFormat,
    *,
    arguments_text: bool = False,
    content_null_aware: bool = False,
) -> list[dict[str, Any]]:
    """Deep-copied messages ready for the template (the caller's objects are never changed)."""
    # ``type(...) is`` first: a list and a dict (what every request brings) answer at once,
    # where the ABC checks each run a Python call of ``ABCMeta.__instancecheck__``.
    if type(messages) is not list and (isinstance(messages, str | bytes) or not isinstance(messages, Sequence)):
        raise ChatTemplateError("messages must be a list of message objects")
    if not messages:
        raise ChatTemplateError("cannot apply the chat template to an empty conversation")
    normalized: list[dict[str, Any]] = []
    for index, message in enumerate(messages):
        where = f"messages[{index}]"
        if type(message) is not dict and not isinstance(message, Mapping):
            raise ChatTemplateError(f"{where} must be an object, got {type(message).__name__}")
        if not isinstance(message.get("role"), str):
            raise ChatTemplateError(f"{where} needs a string 'role'")
        # transformers drops None-valued keys: templates handle a missing key, not None.
        # Values are rebuilt as plain JSON data (a fresh copy: the caller's objects are
        # never changed), exactly as transformers' wrapper rebuilds them before a render.
        out = {_plain_key(key): plain(value) for key, value in message.items() if value is not None}
        if message.get("content", "") is None and content_null_aware:
            out["content"] = None  # the template tells null content (DeepSeek V3's tool turns)
        elif message.get("content", "") is None and content_format == "string":
            # OpenAI clients send content: null beside tool_calls; string templates
            # (Qwen's among them) read content unconditionally, so null means "".
            out["content"] = ""
        content = out.get("content")
        if isinstance(content, list) and content_format == "string":
            out["content"] = _flatten_content(content, where)
        elif content is not None and not isinstance(content, str | list):
            raise ChatTemplateError(f"{where}: content must be a string or a list of parts")
        if "tool_calls" in out:
            out["tool_calls"] = _normalize_tool_calls(out["tool_calls"], where, as_text=arguments_text)
        normalized.append(out)
    return normalized


def string_messages(
    messages: Any, aliased: frozenset[str], split: bool
) -> tuple[list[dict[str, Any]], list[str], list[dict[str, Any]]] | None:
    """The common conversation in one pass: a list of messages that hold strings only (a
    role, a content, maybe a name) and no field in ``aliased`` (the reasoning fields
    transformers aliases), which ``normalize_messages`` would copy unchanged and the alias
    would pass as they are. Returns their copies and, with ``split``, their string contents
    in order and the copies with ``...`` where each content was (``RenderMemo.shape``'s
    split); None for any other input, which takes the general path and its checks."""
    if type(messages) is not list or not messages:
        return None
    chat: list[dict[str, Any]] = []
    contents: list[str] = []
    slots: list[dict[str, Any]] = []
    for message in messages:
        if type(message) is not dict or "role" not in message or not aliased.isdisjoint(message):
            return None
        for key, value in message.items():
            if type(value) is not str or type(key) is not str:
                return None
        out = message.copy()
        chat.append(out)
        if split:
            if "content" in out:
                contents.append(out["content"])
                slot = out.copy()
                slot["content"] = ...
                slots.append(slot)
            else:
                slots.append(out)
    return chat, contents, slots


class ChatTemplate:
    """One compiled chat template plus the special tokens it may reference."""

    def __init__(self, source: str, special_tokens: Mapping[str, str] | None = None, *, memo: bool = True) -> None:
        if not isinstance(source, str) or not source.strip():
            raise ChatTemplateError("the chat template is empty")
        self.source = source
        self.special_tokens = dict(special_tokens or {})
        self._utils = _load_renderer()
        environment = self._environment()
        try:
            ast = environment.parse(source)
            self.content_format: ContentFormat = detect_content_format(ast)
            self._compiled = environment.from_string(render_budget.budgeted(ast))
        except jinja2.TemplateError as exc:
            raise ChatTemplateError(f"the chat template does not compile: {exc}") from exc
        except BudgetExceeded as exc:  # nothing runs at compile time; kept for safety
            raise ChatTemplateBudgetError(str(exc)) from None
        memoize_plain_verdicts(environment)  # the same sandbox, its verdicts on plain data kept
        # jinja2 keeps a template's globals as a ChainMap over the environment's, which every
        # render copies key by key in Python (twice: the context's parent and its key set).
        # This environment is the template's own and nothing adds globals after compiling,
        # so one plain dict of the same names and values reads the same and copies in C.
        self._compiled.globals = dict(self._compiled.globals)
        self.arguments_as_text = arguments_as_text(source)
        self.content_null_aware = _CONTENT_IS_NONE.search(source) is not None
        # transformers 5.x aliases reasoning fields for templates; older ones did not.
        alias = getattr(self._utils, "_alias_reasoning_fields", None)
        self._alias = alias or (lambda chat: chat)
        # The fields it aliases: messages without any take ``string_messages``' one pass
        # (None: this transformers does not name them, every message takes the general path).
        fields = getattr(self._utils, "_REASONING_FIELDS", None) if alias is not None else ()
        self._aliased: frozenset[str] | None = (
            frozenset(fields) if isinstance(fields, tuple) and all(type(f) is str for f in fields) else None
        )
        self._plain_specials = plain(self.special_tokens)
        # Renders replayed per conversation shape (``render_memo``); off: every render runs the template.
        self.memo: RenderMemo | None = RenderMemo(source, self._environment) if memo else None

    def _environment(self) -> Any:
        """A fresh environment exactly as transformers builds it (a template that is plain
        text compiles nothing), owned by this template and made budgeted."""
        build = getattr(self._utils, "_cached_compile_jinja_template", None)  # the uncached builder
        if build is not None:
            environment = build("").environment
        else:
            environment = self._utils._compile_jinja_template("").environment.overlay()
        render_budget.install(environment)
        return environment

    def render(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        tools: Sequence[Mapping[str, Any]] | None = None,
        documents: Sequence[Mapping[str, Any]] | None = None,
        add_generation_prompt: bool = True,
        continue_final_message: bool = False,
        chat_template_kwargs: Mapping[str, Any] | None = None,
    ) -> str:
        """The prompt text. Tools and documents are passed to the template as given (an
        OpenAI server decides their shape). Raises ``ChatTemplateError`` on bad input or a
        failing template (including the template's own ``raise_exception``)."""
        prepared = self.prepare(
            messages, tools=tools, documents=documents, add_generation_prompt=add_generation_prompt,
            continue_final_message=continue_final_message, chat_template_kwargs=chat_template_kwargs,
        )  # fmt: skip
        return prepared.text if prepared.text is not None else prepared.finish()

    def prepare(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        tools: Sequence[Mapping[str, Any]] | None = None,
        documents: Sequence[Mapping[str, Any]] | None = None,
        add_generation_prompt: bool = True,
        continue_final_message: bool = False,
        chat_template_kwargs: Mapping[str, Any] | None = None,
    ) -> PreparedRender:
        """``render``'s first half, which runs no template code: the inputs checked and made
        plain, and the memo asked (``text`` set when it answered). ``finish`` runs the
        template. Raises ``ChatTemplateError`` on bad input."""
        if continue_final_message and add_generation_prompt:
            raise ChatTemplateError(
                "continue_final_message and add_generation_prompt cannot both be set"
            )
        kwargs = dict(chat_template_kwargs or {})
        clash = sorted(_RESERVED_KWARGS & kwargs.keys())
        if clash:
            raise ChatTemplateError(f"chat_template_kwargs may not set {', '.join(clash)}")
        if tools is not None and not all(isinstance(t, Mapping) for t in tools):
            raise ChatTemplateError("tools must be a list of objects")
        if documents is not None and not all(isinstance(d, Mapping) for d in documents):
            raise ChatTemplateError("documents must be a list of objects")
        memo, shape = self.memo, None
        keep = memo is not None and not continue_final_message
        common = string_messages(messages, self._aliased, keep) if self._aliased is not None else None
        if common is None:
            conversation = normalize_messages(
                messages,
                self.content_format,
                arguments_text=self.arguments_as_text,
                content_null_aware=self.content_null_aware,
            )
        try:
            chat = self._alias(conversation) if common is None else common[0]
            plain_tools = plain([dict(t) for t in tools]) if tools is not None else None
            plain_documents = plain([dict(d) for d in documents]) if documents is not None else None
            template_kwargs = {**self._plain_specials, **plain(kwargs)} if kwargs else self._plain_specials
            if keep and memo is not None:
                extra = (plain_tools, plain_documents, add_generation_prompt,
                         None if template_kwargs is self._plain_specials else template_kwargs)  # fmt: skip
                shape = memo.shape(chat, extra) if common is None else memo.shape_of(common[1], common[2], extra)
        except Exception as exc:  # the inputs cannot be made plain: a client error, as a render's
            raise ChatTemplateError(f"chat template error: {exc}") from exc
        prepared = PreparedRender(
            self, (messages, tools, documents), chat, plain_tools, plain_documents, add_generation_prompt,
            continue_final_message, template_kwargs, shape,
        )  # fmt: skip
        if shape is not None:
            assert memo is not None
            prepared.text = memo.render(shape)
        return prepared

    def finish(self, prepared: PreparedRender) -> str:
        """``render``'s second half: the template run on what ``prepare`` made, under the
        render budget; the memo learns from it."""
        messages, tools, documents = prepared.request
        render_budget.start(messages, tools, documents)
        try:
            text = self._render_plain(
                prepared.chat,
                tools=prepared.tools,
                documents=prepared.documents,
                add_generation_prompt=prepared.add_generation_prompt,
                continue_final_message=prepared.continue_final_message,
                kwargs=prepared.kwargs,
            )
        except ChatTemplateError:
            raise
        except BudgetExceeded as exc:
            raise ChatTemplateBudgetError(str(exc)) from None
        except Exception as exc:
            # A template is arbitrary code: any failure while rendering it (its own
            # raise_exception, an undefined attribute, a type error) means these inputs
            # cannot be rendered, which the server reports as a client error.
            raise ChatTemplateError(f"chat template error: {exc}") from exc
        finally:
            render_budget.stop()
        if prepared.shape is not None and self.memo is not None:
            context = {"tools": prepared.tools, "documents": prepared.documents,
                       "add_generation_prompt": prepared.add_generation_prompt, **prepared.kwargs}  # fmt: skip
            self.memo.learn(prepared.shape, context, text)
        return text

    def _render_plain(
        self,
        chat: list[dict[str, Any]],
        *,
        tools: list[Any] | None,
        documents: list[Any] | None,
        add_generation_prompt: bool,
        continue_final_message: bool,
        kwargs: dict[str, Any],
    ) -> str:
        """The compiled template on data that is already plain and aliased
        (``render_jinja_template``'s call without its copy): the same names, and its
        tag-and-trim for ``continue_final_message``."""
        final = _tag_final_message(chat, self.source) if continue_final_message else None
        rendered = str(self._compiled.render(
            messages=chat,
            tools=tools,
            documents=documents,
            add_generation_prompt=add_generation_prompt,
            **kwargs,
        ))
        return rendered if final is None else _trim_at_tag(rendered, final)


class PreparedRender:
    """A render made ready by ``ChatTemplate.prepare``: ``text`` when the memo answered,
    else ``finish()`` runs the template (on whatever thread its caller chooses)."""

    __slots__ = (
        "add_generation_prompt", "chat", "continue_final_message", "documents", "kwargs", "request", "shape",
        "template", "text", "tools",
    )  # fmt: skip

    def __init__(
        self, template: ChatTemplate, request: tuple[Any, Any, Any], chat: list[dict[str, Any]],
        tools: list[Any] | None, documents: list[Any] | None, add_generation_prompt: bool,
        continue_final_message: bool, kwargs: dict[str, Any], shape: Shape | None,
    ) -> None:  # fmt: skip
        self.template = template
        self.request = request  # the caller's (messages, tools, documents): the budget's measure
        self.chat = chat
        self.tools = tools
        self.documents = documents
        self.add_generation_prompt = add_generation_prompt
        self.continue_final_message = continue_final_message
        self.kwargs = kwargs
        self.shape = shape
        self.text: str | None = None

    def finish(self) -> str:
        return self.template.finish(self)


def _tag_final_message(chat: list[dict[str, Any]], source: str) -> str:
    """Append the continue tag to the final message's content (its last text part, for a
    list); the content as it was. transformers' checks and messages."""
    last = chat[-1] = dict(chat[-1])  # the aliased list may share the message: tag a copy
    content = last.get("content")
    if content is None:
        raise ChatTemplateError('continue_final_message is set but the final message has no "content" to continue!')
    if "content" not in source:
        raise ChatTemplateError(
            'continue_final_message is set to "content" but this is not an accepted field in the chat_template'
        )
    if isinstance(content, list):
        parts = last["content"] = [dict(p) if isinstance(p, dict) else p for p in content]
        for part in reversed(parts):
            if isinstance(part, dict) and "text" in part:
                final = str(part["text"])
                part["text"] = final + _CONTINUE_TAG
                return final
        raise ChatTemplateError("continue_final_message is set but we could not find any text to continue in the final message!")
    last["content"] = content + _CONTINUE_TAG
    return str(content)


def _trim_at_tag(rendered: str, final: str) -> str:
    """The render cut where the final message's tag starts (trailing space trimmed when the
    template trimmed it)."""
    tag = _CONTINUE_TAG.strip()
    if final.strip() not in rendered or tag not in rendered:
        raise ChatTemplateError(
            "continue_final_message is set but the final message does not appear in the chat after applying the "
            "chat template! This can happen if the chat template deletes portions of the final message."
        )
    at = rendered.rindex(tag)
    if rendered[at : at + len(_CONTINUE_TAG)] == _CONTINUE_TAG:
        return rendered[:at]
    return rendered[:at].rstrip()
