"""A worker's tokenizer zip is read only up to the size bound, and its sha256 is checked."""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator

import pytest

from gateway.proto import common_pb2
from gateway.workers.tokenizer_fetch import TokenizerFetchError, read_tokenizer_zip


class Chunks:
    """A GetTokenizer stream: ``count`` chunks of ``size`` bytes (the last with ``sha256``);
    records how many were pulled and whether the call was cancelled."""

    def __init__(self, count: int, size: int, sha256: str | None = None) -> None:
        self.count, self.size = count, size
        self.data = b"z" * (count * size)
        self.sha256 = hashlib.sha256(self.data).hexdigest() if sha256 is None else sha256
        self.pulled = 0
        self.cancelled = False

    def __aiter__(self) -> AsyncIterator[common_pb2.GetTokenizerChunk]:
        return self._gen()

    async def _gen(self) -> AsyncIterator[common_pb2.GetTokenizerChunk]:
        for i in range(self.count):
            self.pulled += 1
            last = i == self.count - 1
            yield common_pb2.GetTokenizerChunk(data=b"z" * self.size, sha256=self.sha256 if last else "")

    def cancel(self) -> bool:
        self.cancelled = True
        return True


async def test_a_zip_within_the_bound_comes_back_checked() -> None:
    chunks = Chunks(4, 1000)
    data, digest = await read_tokenizer_zip(chunks, max_bytes=4000, source="w")  # type: ignore[arg-type]
    assert data == chunks.data and digest == chunks.sha256


async def test_the_download_stops_as_soon_as_the_bound_is_passed() -> None:
    chunks = Chunks(10_000, 1 << 16)  # 625 MiB if read to the end
    with pytest.raises(TokenizerFetchError, match="larger than 1048576 bytes"):
        await read_tokenizer_zip(chunks, max_bytes=1 << 20, source="w")  # type: ignore[arg-type]
    assert chunks.pulled == 17 and chunks.cancelled


@pytest.mark.parametrize("declared", ["", "00" * 32])
async def test_a_missing_or_wrong_sha256_is_refused(declared: str) -> None:
    with pytest.raises(TokenizerFetchError, match="sha256 mismatch"):
        await read_tokenizer_zip(Chunks(2, 10, sha256=declared), max_bytes=100, source="w")  # type: ignore[arg-type]
