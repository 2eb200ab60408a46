#!/usr/bin/env python
"""CPU cost of the HTTP guard (``server/http/guard.py``) against plain uvicorn httptools.

    token-gateway bench http-guard [--requests N] [--rounds R]

Feeds the same keep-alive request (a typical OpenAI client's head and a small JSON body)
N times through each protocol class on an in-memory transport, with a trivial ASGI app,
alternating rounds so both see the same machine load; prints CPU microseconds per
request for each and their ratio. Bounded: N x R requests per side.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from typing import Any

import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from uvicorn.server import ServerState

from gateway.server.http.guard import guarded_protocol
from gateway.server.http.limits import HttpLimitsConfig
from gateway_lab.bench import results

BODY = b'{"model": "m", "messages": [{"role": "user", "content": "hello there"}], "max_tokens": 16}'
REQUEST = (
    b"POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1:30000\r\naccept-encoding: gzip, deflate\r\n"
    b"connection: keep-alive\r\naccept: application/json\r\ncontent-type: application/json\r\n"
    b"user-agent: OpenAI/Python 1.99.0\r\nx-stainless-lang: python\r\nx-stainless-os: Linux\r\n"
    b"authorization: Bearer sk-0123456789abcdef\r\ncontent-length: " + str(len(BODY)).encode() + b"\r\n\r\n" + BODY
)


class Transport(asyncio.Transport):
    def __init__(self) -> None:
        super().__init__()
        self.closing = False

    def write(self, data: Any) -> None:
        pass

    def is_closing(self) -> bool:
        return self.closing

    def close(self) -> None:
        self.closing = True

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"peername": ("127.0.0.1", 5000), "sockname": ("127.0.0.1", 30000)}.get(name, default)

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


async def app(scope: Any, receive: Any, send: Any) -> None:
    await receive()
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]})
    await send({"type": "http.response.body", "body": b"{}"})


async def run(cls: type, n: int) -> float:
    config = uvicorn.Config(app, log_level="warning", lifespan="off", loop="none")
    config.load()
    proto = cls(config=config, server_state=ServerState(), app_state={})
    proto.connection_made(Transport())
    started = time.process_time()
    for _ in range(n):
        proto.data_received(REQUEST)
        await asyncio.sleep(0)  # let the request's task run to completion
        await asyncio.sleep(0)
    cpu = time.process_time() - started
    proto.connection_lost(None)
    return cpu / n * 1e6


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The scenario's flags (``token-gateway bench NAME --help``)."""
    parser.add_argument("--requests", type=int, default=20000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", default="", help="also write the results here as JSON")


def main(args: argparse.Namespace) -> int | None:
    """Run the scenario with parsed flags; the exit status."""
    p, g = asyncio.run(measure(args))
    header = ("protocol", "µs CPU per request", "ratio")
    rows = [("httptools", f"{p:.2f}", "1.000"), ("guarded", f"{g:.2f}", f"{g / p:.3f}")]
    table = results.Table.of(f"median of {args.rounds} rounds of {args.requests} requests", header, rows, labels=1)
    data = {"httptools_us": p, "guarded_us": g, "ratio": g / p}
    return results.write(results.Result(tables=[table], data=data), json_path=args.json)


async def measure(args: argparse.Namespace) -> tuple[float, float]:
    """Median µs of CPU per request of plain httptools and of the guarded protocol."""
    guarded = guarded_protocol(HttpLimitsConfig())
    plain_us: list[float] = []
    guard_us: list[float] = []
    for _ in range(args.rounds):
        plain_us.append(await run(HttpToolsProtocol, args.requests))
        guard_us.append(await run(guarded, args.requests))
    p, g = sorted(plain_us)[len(plain_us) // 2], sorted(guard_us)[len(guard_us) // 2]
    return p, g
