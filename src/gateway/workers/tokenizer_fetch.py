"""Downloading a worker's tokenizer zip (GetTokenizer), bounded in size.

The zip comes in chunks with its sha256 on the last one. A worker is trusted no more
than a client, so the chunks are counted as they arrive and the stream is cancelled
the moment their total passes the bound: an endless or huge stream costs at most the
bound in memory, never the whole stream. One message is capped on its own, before it is
read (``workers.client.MAX_TOKENIZER_MESSAGE_BYTES``). Every way the download can fail is a
``TokenizerFetchError`` with the reason, which ``POST /workers`` reports as a 502.
"""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator

from gateway.proto import common_pb2
from gateway.workers.transport import CallCode, WorkerCallError, WorkerTransport

DEFAULT_MAX_TOKENIZER_BYTES = 64 * 1024 * 1024
"""Largest tokenizer zip accepted from a worker (a large vocabulary zips to ~10 MiB)."""


class TokenizerFetchError(ValueError):
    """The worker's tokenizer could not be downloaded: too large, mismatched, or failed."""


async def read_tokenizer_zip(
    chunks: AsyncIterator[common_pb2.GetTokenizerChunk], *, max_bytes: int, source: str
) -> tuple[bytes, str]:
    """The zip and its sha256 (checked) from a GetTokenizer stream; stops reading (and
    cancels the call, when it can be) as soon as more than ``max_bytes`` arrived."""
    parts: list[bytes] = []
    total = 0
    declared = ""
    try:
        async for chunk in chunks:
            total += len(chunk.data)
            if total > max_bytes:
                raise TokenizerFetchError(
                    f"tokenizer from {source} is larger than {max_bytes} bytes (--max-tokenizer-bytes); download stopped"
                )
            parts.append(chunk.data)
            if chunk.sha256:
                declared = chunk.sha256
    except WorkerCallError as exc:
        if exc.code is not CallCode.RESOURCE_EXHAUSTED:
            raise
        raise TokenizerFetchError(  # one message past the channel's per-message cap
            f"tokenizer from {source}: a GetTokenizer message is too large ({exc.message}); download stopped"
        ) from None
    finally:
        cancel = getattr(chunks, "cancel", None)
        if cancel is not None:
            cancel()  # a no-op once the call has ended
    data = b"".join(parts)
    actual = hashlib.sha256(data).hexdigest()
    if not declared or declared.strip().lower() != actual:
        raise TokenizerFetchError(f"tokenizer from {source}: sha256 mismatch (declared {declared!r}, got {actual})")
    return data, actual


async def fetch_tokenizer_zip(client: WorkerTransport, *, max_bytes: int, timeout: float = 60.0) -> tuple[bytes, str]:
    """``read_tokenizer_zip`` over ``client``'s GetTokenizer call."""
    return await read_tokenizer_zip(client.tokenizer_chunks(timeout=timeout), max_bytes=max_bytes, source=client.url)
