"""Suite-wide fixtures.

Every whole-stack test starts a gateway that fetches its model's tokenizer from a
simulated worker into a fresh folder and loads it. Parsing a real tokenizer.json (the
Rust ``tokenizers`` parse of several megabytes) is most of a stack's start-up, and it is
the same files each time; so within one test process the parsed backend is kept per
content of the files that shape it (the catalog's parse in a child process, too, is
replaced by this: tests/pipeline/test_encoder_build.py tests that one). Fetching, unpacking, checking and wrapping the
tokenizer still happen for every gateway, and the first load of each tokenizer parses it
for real. The tokenizer's own tests (tests/tokenization) change the backends they load
and test the loading itself, so they always parse.
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from tokenizers import Tokenizer as BackendTokenizer

from gateway.pipeline import catalog as catalog_module
from gateway.sync.local_server import LocalNatsServer
from gateway.tokenization import tokenizer as tokenizer_module

# The files Tokenizer's constructor reads to adjust the backend it is given (truncation,
# padding, and the BOS/EOS post-processor): a shared backend gets the same adjustment.
_SHAPING_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


class _ParsedOnce:
    """Stands in for ``tokenizers.Tokenizer`` where gateway's Tokenizer loads a file."""

    _parsed: dict[str, BackendTokenizer] = {}
    _lock = threading.Lock()

    @classmethod
    def from_file(cls, path: str) -> BackendTokenizer:
        folder = Path(path).parent
        digest = hashlib.sha256(Path(path).read_bytes())
        for name in _SHAPING_FILES[1:]:
            extra = folder / name
            digest.update(extra.read_bytes() if extra.is_file() else b"-")
        key = digest.hexdigest()
        with cls._lock:
            found = cls._parsed.get(key)
        if found is None:
            found = BackendTokenizer.from_file(path)  # a bad file raises and is not kept
            with cls._lock:
                found = cls._parsed.setdefault(key, found)
        return found


@pytest.fixture(autouse=True)
def _tokenizer_parsed_once(request: pytest.FixtureRequest) -> Iterator[None]:
    if "tokenization" in request.node.path.parts:
        yield
        return
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(tokenizer_module, "BackendTokenizer", _ParsedOnce)
        mp.setattr(catalog_module, "parse_in_child", lambda json_file, *_, **__: _ParsedOnce.from_file(str(json_file)))
        yield


@pytest.fixture
async def nats() -> AsyncIterator[LocalNatsServer]:
    """A real nats-server on a free loopback port for one test (the sync bus's tests)."""
    server = await LocalNatsServer().start()
    try:
        yield server
    finally:
        await server.stop()
