"""``bench hostile``'s large-valid-body probes: well-formed requests as large as the body
bound lets a client send, several at once, on every route that takes a body.

A body that is merely large costs the gateway its JSON parse and its validation on the
event loop, in proportion to the number of values it holds (token ids, messages, input
items) far more than to its bytes. Each probe sends ``PARALLEL`` copies of one body at
once and repeats; the table row says what the gateway answered and how /health fared.
The gRPC door's rows send the largest message of each kind its message bound admits.

Bodies are built once per probe (their build is not in the measured window).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import orjson

from gateway.protocol import limits

PARALLEL = 4
"""Copies of a probe's body sent at once."""

HEADROOM = 64 * 1024
"""Bytes left under the body bound for the JSON around a probe's repeated part."""

ID = 123_456
"""The id every token-id body repeats (six digits: ``123456,`` is seven bytes, the widest id a
150k vocabulary has)."""


@dataclass(frozen=True, slots=True)
class Body:
    """One HTTP probe: its row's name, its route and how to build its JSON body (only
    for a probe that runs: each is tens of MiB)."""

    name: str
    path: str
    build: Callable[[], bytes]


def ids_fitting(limit: int, per_id: int = 7) -> int:
    """How many six-digit ids fit a JSON body of ``limit`` bytes (``per_id`` bytes each)."""
    return max(1, (limit - HEADROOM) // per_id)


def http_bodies(model: str, limit: int) -> list[Body]:
    """The HTTP probes, each body as large as ``limit`` (the gateway's body bound) admits."""
    count = ids_fitting(limit)
    ids = [ID] * count
    words = "lorem ipsum dolor sit amet " * ((limit - HEADROOM) // 27)  # no commas: one value
    tiny = {"role": "user", "content": "hi"}
    tinies = (limit - HEADROOM) // (len(orjson.dumps(tiny)) + 1)

    def dumps(body: dict[str, Any]) -> Callable[[], bytes]:
        return lambda: orjson.dumps({"model": model, **body})

    half = ids[: count // 2]
    bound = [ID] * (limits.DEFAULT_MAX_BODY_VALUES - 16)  # the most the default values bound admits
    line = {"role": "user", "content": "a message of a long conversation"}
    cap, items = [line] * limits.MAX_MESSAGES, [line] * limits.MAX_INPUT_ITEMS
    return [
        Body(f"{len(bound):,} ids (the default values bound) to /v1/completions", "/v1/completions",
             dumps({"prompt": bound, "max_tokens": 1})),
        Body(f"chat of {len(cap):,} messages (the message cap)", "/v1/chat/completions",
             dumps({"messages": cap, "max_tokens": 1})),
        Body(f"Responses input of {len(items):,} items (the item cap)", "/v1/responses",
             dumps({"input": items, "max_output_tokens": 1})),
        Body(f"{count:,} ids to /v1/completions", "/v1/completions", dumps({"prompt": ids, "max_tokens": 1})),
        Body(f"{count:,} input_ids to /generate", "/generate",
             dumps({"input_ids": ids, "sampling_params": {"max_new_tokens": 1}})),
        Body("two prompts of ids to /v1/completions", "/v1/completions",
             dumps({"prompt": [half, half], "max_tokens": 1})),
        Body(f"chat of {tinies:,} tiny messages", "/v1/chat/completions",
             dumps({"messages": [tiny] * tinies, "max_tokens": 1})),
        Body(f"chat of one {len(words) >> 20} MiB message", "/v1/chat/completions",
             dumps({"messages": [{"role": "user", "content": words}], "max_tokens": 1})),
        Body(f"Responses input of {tinies:,} items", "/v1/responses",
             dumps({"input": [tiny] * tinies, "max_output_tokens": 1})),
        Body(f"tokenize {len(words) >> 20} MiB of text", "/v1/tokenize", dumps({"prompt": words})),
        Body(f"tokenize {tinies:,} messages", "/v1/tokenize", dumps({"messages": [tiny] * tinies})),
        Body(f"detokenize {len(ids):,} ids", "/v1/detokenize", dumps({"tokens": ids})),
        Body(f"embed {len(ids):,} ids", "/v1/embeddings", dumps({"input": ids})),
    ]  # fmt: skip


def grpc_calls(channel: Any, model: str, limit: int) -> list[tuple[str, Callable[[], Callable[[], Awaitable[str]]]]]:
    """The gRPC door's probes: its largest token-id prompt, its longest chat and its
    largest detokenize, each as large as the message bound ``limit`` admits (ids of three
    varint bytes). Each row's second part builds its message and gives the call."""
    import grpc

    from gateway.proto import gateway_pb2 as gpb
    from gateway.proto import gateway_pb2_grpc as gpb_grpc

    stub = gpb_grpc.TokenGatewayStub(channel)
    count = ids_fitting(limit, per_id=3)
    tiny = gpb.ChatMessage(role="user", content="hi")
    messages = (limit - HEADROOM) // (tiny.ByteSize() + 2)

    def completion(ids: int = count) -> Any:
        out = gpb.CompletionRequest(model=model, token_ids=gpb.TokenIds(ids=[ID] * ids))
        out.sampling.max_tokens = 1
        return out

    bound = limits.DEFAULT_MAX_BODY_VALUES - 16

    def chat() -> Any:
        out = gpb.ChatCompletionRequest(model=model, messages=[tiny] * messages)
        out.sampling.max_tokens = 1
        return out

    def calling(method: Any, build: Callable[[], Any]) -> Callable[[], Callable[[], Awaitable[str]]]:
        def ready() -> Callable[[], Awaitable[str]]:
            request = build()

            async def call() -> str:
                try:
                    await method(request, timeout=60)
                except grpc.aio.AioRpcError as exc:
                    return str(exc.code().name)
                return "OK"

            return call

        return ready

    return [
        (f"gRPC Completion of {bound:,} ids (the default values bound)",
         calling(stub.Completion, lambda: completion(bound))),
        (f"gRPC Completion of {count:,} ids", calling(stub.Completion, completion)),
        (f"gRPC ChatCompletion of {messages:,} messages", calling(stub.ChatCompletion, chat)),
        (f"gRPC Detokenize of {count:,} ids",
         calling(stub.Detokenize, lambda: gpb.DetokenizeRequest(model=model, tokens=[ID] * count))),
    ]


async def at_once(attempt: Callable[[], Awaitable[str]], times: int = PARALLEL) -> str:
    """``attempt`` ``times`` at once: the answers, each once, with how many gave it."""
    answers = await asyncio.gather(*(attempt() for _ in range(times)))
    return ", ".join(f"{a} x{answers.count(a)}" for a in sorted(set(answers)))
