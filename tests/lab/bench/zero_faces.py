"""One zero-cost worker served through one of its HTTP faces, for the faces' tests."""

from __future__ import annotations

import contextlib
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

from aiohttp import web

from gateway_lab.bench.workloads import default_tokenizer_dir
from gateway_lab.bench.zero_fleet import ZeroWorker, model_folder, reply_ids


@contextlib.asynccontextmanager
async def served(
    tmp_path: Path, start: Callable[[ZeroWorker, int], Awaitable[web.AppRunner]]
) -> AsyncIterator[tuple[ZeroWorker, str]]:
    """The worker (4,096-token context, 8,192 KV tokens) and its face's base URL."""
    folder = model_folder(default_tokenizer_dir(), tmp_path, 4096)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    w = ZeroWorker(folder, reply_ids(folder), 0.0, 8192, 4096, port)
    runner = await start(w, port)
    try:
        yield w, f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()
