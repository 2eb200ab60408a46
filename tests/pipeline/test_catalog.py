"""The served models (pipeline/catalog.py): a model's tokenizer is loaded once when its
first worker registers, every later worker's facts fold in (the tightest limit wins),
and a request's ``model`` finds its entry by name, alias or, with one model, by default."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from gateway.pipeline import catalog as catalog_module
from gateway.pipeline import encoder_build
from gateway.pipeline.catalog import ModelCatalog, model_facts
from gateway.protocol.errors import ModelNotFoundError
from gateway.tokenization import Tokenizer, TokenizerRegistry, backend_parts
from gateway.workers.transport import CallCode, WorkerCallError
from gateway.workers.worker import WorkerInfo
from tests.tokenization.helpers import qwen_files, small_byte_level_tokenizer


class _NoTokenizerClient:
    """A worker that does not serve GetTokenizer (SGLang's HTTP server)."""

    url = "grpc://w:1"

    async def _chunks(self) -> AsyncIterator[object]:
        raise WorkerCallError(CallCode.UNIMPLEMENTED, "no GetTokenizer")
        yield  # pragma: no cover

    def tokenizer_chunks(self, timeout: float = 60.0) -> AsyncIterator[object]:
        return self._chunks()


@dataclass
class _Worker:
    model: str
    info: WorkerInfo
    url: str = "grpc://w:1"
    client: object = field(default_factory=_NoTokenizerClient)


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> TokenizerRegistry:
    """One registry for the tests that load from an explicit path: it loads the tokenizer once."""
    return TokenizerRegistry(tmp_path_factory.mktemp("tokenizers"))


def _catalog(registry: TokenizerRegistry, **options: object) -> ModelCatalog:
    catalog = ModelCatalog(Path("unused"), tokenizer_path=str(qwen_files()), **options)  # type: ignore[arg-type]
    catalog.registry = registry
    return catalog


def _worker(model: str = "qwen", **info: object) -> _Worker:
    return _Worker(model, WorkerInfo(model=model, **info))  # type: ignore[arg-type]


@pytest.fixture(autouse=True)
def _no_template_warmup(monkeypatch: pytest.MonkeyPatch) -> list[Tokenizer]:
    """Warming compiles every chat template (about a second): recorded, not run."""
    warmed: list[Tokenizer] = []
    monkeypatch.setattr(Tokenizer, "warm_chat_templates", lambda self: warmed.append(self))
    return warmed


@pytest.fixture(autouse=True)
def _encoders_warmed(monkeypatch: pytest.MonkeyPatch) -> list[Tokenizer]:
    """Building the fast encoder takes seconds of CPU (and a child process): recorded, not run."""
    warmed: list[Tokenizer] = []
    monkeypatch.setattr(catalog_module, "build_encoder", lambda tokenizer: warmed.append(tokenizer))
    return warmed


async def test_the_encoders_are_built_before_the_model_takes_traffic(
    shared: TokenizerRegistry, _encoders_warmed: list[Tokenizer]
) -> None:
    entry = await _catalog(shared).ensure(_worker())  # type: ignore[arg-type]
    assert _encoders_warmed == [entry.tokenizer]
    await _catalog(shared, warm_encoders=False).ensure(_worker())  # type: ignore[arg-type]
    assert len(_encoders_warmed) == 1  # --no-encoder-at-load: built lazily by the engine


class _Helper:
    """A stand-in for the tokenizer helper process: the tokenizers it was asked to hold."""

    def __init__(self) -> None:
        self.attached: list[Tokenizer] = []

    def attach(self, tokenizer: Tokenizer) -> bool:
        self.attached.append(tokenizer)
        return True


async def test_a_model_that_joins_once_the_helper_is_set_has_its_merges_held_there(
    shared: TokenizerRegistry, _encoders_warmed: list[Tokenizer]
) -> None:
    catalog = _catalog(shared)
    first = await catalog.ensure(_worker("a"))  # type: ignore[arg-type]
    helper = catalog.tokenizer_helper = _Helper()  # type: ignore[assignment]
    later = await catalog.ensure(_worker("b"))  # type: ignore[arg-type]
    assert helper.attached == [later.tokenizer] and first.tokenizer not in helper.attached
    assert _encoders_warmed[-1] is later.tokenizer  # the fast encoder first, then the helper


class _HoldingHelper(_Helper):
    """One that holds what it is given: encodes go elsewhere (here, nowhere: none is made)."""

    def attach(self, tokenizer: Tokenizer) -> bool:
        backend_parts.encode_elsewhere(tokenizer.backend, lambda texts, special, plain: [[] for _ in texts])
        return super().attach(tokenizer)


@pytest.mark.parametrize("holds", [True, False], ids=["the helper holds it", "the helper could not"])
async def test_a_model_joining_with_the_helper_set_keeps_its_vocabulary_in_tables(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, holds: bool
) -> None:
    """No model of its vocabulary is built here; when the helper cannot hold it, the whole
    tokenizer is built here before the model takes traffic."""
    from tokenizers import Tokenizer as BackendTokenizer
    from tokenizers import decoders

    monkeypatch.setattr(encoder_build, "plan_in_child", lambda path, make: make(path))  # the child's work, here
    monkeypatch.setattr(catalog_module, "parse_in_child", encoder_build.parse_in_child)  # not the suite's shared parse
    monkeypatch.setattr(encoder_build, "_PREPARED", {})  # what this parse keeps stays with this test
    monkeypatch.setattr(encoder_build, "_KEPT", {})
    folder = small_byte_level_tokenizer(tmp_path / "small", f"joined-{holds}")  # its own files: not a kept parse
    backend = BackendTokenizer.from_file(str(folder / "tokenizer.json"))
    backend.decoder = decoders.ByteLevel()
    backend.save(str(folder / "tokenizer.json"))
    catalog = ModelCatalog(tmp_path / "cache", tokenizer_path=str(folder))
    catalog.tokenizer_helper = (_HoldingHelper() if holds else _Helper())  # type: ignore[assignment]
    entry = await catalog.ensure(_worker("joined"))  # type: ignore[arg-type]
    tok = entry.tokenizer
    assert tok.vocabulary_in_tables and catalog.tokenizer_helper.attached == [tok]  # type: ignore[union-attr]
    assert tok.merges_elsewhere is holds
    assert (tok.backend in backend_parts._WHOLE) is not holds
    assert tok.decode([256, 257], skip_special_tokens=False) == "ababc"


async def test_the_first_worker_loads_the_model_once(shared: TokenizerRegistry, _no_template_warmup: list[Tokenizer]) -> None:
    catalog = _catalog(shared)
    worker = _worker(model_path="/models/qwen", context_length_arg=2048)
    a, b = await asyncio.gather(catalog.ensure(worker), catalog.ensure(worker))  # type: ignore[arg-type]
    assert a is b and catalog.names() == ["qwen"] and catalog.entries() == [a]
    assert _no_template_warmup == [a.tokenizer]  # warmed once, off the first chat request
    assert a.max_context_length == 2048 and a.worker_model == "qwen" and a.reply_cache is None
    assert a.aliases == {"qwen", "/models/qwen"}
    assert catalog._loading == {}  # no load task kept after it finished


async def test_later_workers_tighten_the_limits(shared: TokenizerRegistry) -> None:
    catalog = _catalog(shared)
    entry = await catalog.ensure(_worker(context_length_arg=4096, max_req_input_len=4000))  # type: ignore[arg-type]
    assert (entry.max_context_length, entry.max_input_tokens) == (4096, 4000)
    await catalog.ensure(_worker(context_length_arg=1024, max_req_input_len=1000, model_path="/other"))  # type: ignore[arg-type]
    assert (entry.max_context_length, entry.max_input_tokens) == (1024, 1000)
    assert entry.facts.context_length == 1024 and "/other" in entry.aliases
    await catalog.ensure(_worker(context_length_arg=8192, max_req_input_len=8000))  # type: ignore[arg-type]
    assert (entry.max_context_length, entry.max_input_tokens) == (1024, 1000)  # a looser worker loosens nothing
    described = entry.describe()
    assert described["name"] == "qwen" and described["max_input_tokens"] == {
        "value": 1000, "source": "the workers' schedulers (the lowest)"}
    assert described["vocab_size"] == {"value": entry.tokenizer.vocab_size, "source": "tokenizer.json"}


async def test_get_finds_a_model_by_name_alias_or_as_the_only_one(shared: TokenizerRegistry) -> None:
    catalog = _catalog(shared)
    with pytest.raises(ModelNotFoundError):
        catalog.get(None)  # nothing served yet
    entry = await catalog.ensure(_worker(model_path="/models/qwen"))  # type: ignore[arg-type]
    assert catalog.get("qwen") is catalog.get("") is catalog.get(None) is catalog.get("/models/qwen") is entry
    with pytest.raises(ModelNotFoundError):
        catalog.get("gpt-4")


async def test_a_served_name_is_public_and_the_worker_name_keys_the_pools(shared: TokenizerRegistry) -> None:
    catalog = _catalog(shared, served_name="public", reply_token_reuse=True)
    entry = await catalog.ensure(_worker("qwen"))  # type: ignore[arg-type]
    assert catalog.names() == ["public"] and entry.name == "public"
    assert catalog.public_name("anything") == "public"
    assert catalog.worker_model("public") == "qwen"
    assert catalog.worker_model("unknown") == "unknown"
    assert catalog.get("qwen") is entry and entry.reply_cache is not None


async def test_a_worker_without_get_tokenizer_may_name_a_folder_on_this_host(tmp_path: Path) -> None:
    catalog = ModelCatalog(tmp_path / "cache")
    entry = await catalog.ensure(_worker(tokenizer_path=str(qwen_files())))  # type: ignore[arg-type]
    assert entry.tokenizer.vocab_size > 100_000


async def test_no_tokenizer_anywhere_is_an_error_not_a_guess(tmp_path: Path) -> None:
    catalog = ModelCatalog(tmp_path / "cache")
    with pytest.raises(Exception, match="no GetTokenizer"):
        await catalog.ensure(_worker(tokenizer_path=str(tmp_path / "absent")))  # type: ignore[arg-type]
    assert catalog.names() == []


def test_model_facts_prefers_the_worker_override_to_the_model_files(shared: TokenizerRegistry) -> None:
    resolved = shared.resolve_local("qwen", str(qwen_files()))
    assert resolved is not None
    tok = resolved.tokenizer
    plain = model_facts(tok, _worker())  # type: ignore[arg-type]
    overridden = model_facts(tok, _worker(context_length_arg=777))  # type: ignore[arg-type]
    assert overridden.context_length == 777 and plain.context_length != 777
