"""Bounds the request models enforce, in one place so the server can quote them.

They guard the gateway and the workers' grammar compilers against requests that
are well-typed but absurd (a 10 MB tool schema, n=10000), not against honest use.
"""

from __future__ import annotations

MAX_N = 128
"""Most completions one request may ask for (``n``)."""

MAX_BATCH = 256
"""Most prompts (or embedding inputs) one request may carry; each is a worker request."""

MAX_TOP_LOGPROBS = 20
"""OpenAI's upper bound for chat ``top_logprobs``."""

MAX_COMPLETION_LOGPROBS = 5
"""OpenAI's upper bound for the legacy completions ``logprobs``."""

MAX_STOP_SEQUENCES = 32
"""OpenAI allows 4; SGLang clients send more, so the gateway is more generous."""

MAX_STOP_TOKEN_IDS = 256

MAX_TOOLS = 128
"""Most tools one request may declare."""

MAX_MESSAGES = 16_384
"""Most messages one chat (or Messages API) request may carry. Each costs a few µs of
validation on the event loop before any other bound applies: a 14 MiB body of tiny
messages would otherwise hold the loop most of a second."""


MAX_INPUT_ITEMS = 4_096
"""Most input items one Responses API request may carry (messages, function calls and
their outputs). Each costs about 12 µs on the event loop on its way to a chat (its id, its
history entry, its message), several times a chat message's validation: 16,384 held the
loop about 0.19 s a request."""


def check_message_count(value: object, what: str = "messages", limit: int = MAX_MESSAGES, noun: str = "messages") -> object:
    """Refuse a list longer than ``limit`` before its items are validated."""
    if isinstance(value, list) and len(value) > limit:
        raise ValueError(f"{what} may hold at most {limit} {noun}, not {len(value)}")
    return value

DEFAULT_MAX_BODY_VALUES = 1 << 18
"""Most JSON values one request body may hold by default (``--max-body-values``), and most
token ids or messages one gRPC request may carry. A body's parse and checks hold the event
loop about 0.1 ms per thousand token ids (a message or an object costs more), and bodies
that arrive together are parsed back to back: at this bound, four prompts of ids at once
hold it about 0.1 s. A prompt of 262,144 ids less the request's other values passes."""

MAX_SCHEMA_BYTES = 64 * 1024
"""Largest JSON schema (tool parameters or response_format) in serialized bytes."""

MAX_SCHEMA_DEPTH = 32
"""Deepest nesting of a JSON schema (objects and arrays)."""

MAX_JSON_DEPTH = 64
"""Deepest nesting of JSON a request hands to the chat template (tool-call arguments,
chat_template_kwargs): the template and its helpers walk it recursively."""

MAX_LOGIT_BIAS_ENTRIES = 1024

LOGIT_BIAS_RANGE = (-100.0, 100.0)
