"""Building a model's fast encoder (pipeline/encoder_build.py): planned in a child process
from the tokenizer's files, built here from the plan; in this process when there are no
files or the child fails."""

from __future__ import annotations

import functools
import json
import logging
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from tokenizers import Tokenizer as BackendTokenizer
from tokenizers import decoders, models

from gateway.pipeline import encoder_build
from gateway.pipeline.encoder_build import build_encoder, plan_in_child, start_build
from gateway.tokenization import Tokenizer
from gateway.tokenization.backend_parts import merges_deferred, whole
from gateway.tokenization.fast_bpe import FastBpePlan
from gateway.tokenization.length_bound import LengthBound
from gateway.tokenization.vocabulary_table import table_of
from tests.tokenization.helpers import small_byte_level_tokenizer

TEXTS = ["abc abcab", "hello world, abc!", "L'été à Zürich 東京"]


def _pid(path: str) -> tuple[int, None]:
    return os.getpid(), None


def _fail(path: str) -> tuple[FastBpePlan | None, LengthBound | None]:
    raise RuntimeError(f"no plan for {path}")


def _hf(tok: Tokenizer, text: str) -> list[int]:
    """The ids of ``text`` by the tokenizer's file parsed whole (its backend, built in memory)."""
    backend = Tokenizer.from_path(tok.path).backend if tok.path is not None else tok.backend
    ids: list[int] = backend.encode(text, add_special_tokens=False).ids
    return ids


@pytest.fixture(autouse=True)
def _nothing_kept() -> Iterator[None]:
    """Each test starts with no tokenizer kept parsed (``KEPT_PARSES``) and leaves none."""
    encoder_build._KEPT.clear()
    yield
    encoder_build._KEPT.clear()


@pytest.fixture
def no_build_here(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Records every build of the encoder in this process (``Tokenizer.fast_bpe``)."""
    built: list[str] = []
    real = Tokenizer.fast_bpe.func  # type: ignore[attr-defined]

    def spy(self: Tokenizer) -> object:
        built.append(self.name)
        return real(self)

    monkeypatch.setattr(Tokenizer.fast_bpe, "func", spy)
    return built


def test_the_plan_is_made_in_another_process() -> None:
    assert plan_in_child("unused", _pid)[0] != os.getpid()  # type: ignore[arg-type]


def test_the_encoder_is_planned_in_a_child_and_built_here(tmp_path: Path, no_build_here: list[str]) -> None:
    tok = Tokenizer.from_path(small_byte_level_tokenizer(tmp_path / "small", "child"), name="small")
    build_encoder(tok)
    assert no_build_here == []  # the vocabulary walks and the self-check ran elsewhere
    assert tok.fast_bpe_ready and tok.fast_bpe is not None and tok.length_bound_ready
    assert tok.length_bound is not None and tok.length_bound.chars_per_token == 3  # "abc"
    for text in TEXTS:
        assert tok.encode(text, add_special_tokens=False) == _hf(tok, text)


def test_encoders_built_for_the_backend_need_no_child(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = small_byte_level_tokenizer(tmp_path / "small", "shared")
    first = Tokenizer.from_path(folder, name="first")
    first.warm_encoders()
    again = Tokenizer.from_path(folder, name="again")
    again.backend = first.backend  # one parsed backend (several gateways in one process)
    asked: list[str] = []
    monkeypatch.setattr(encoder_build, "plan_in_child", lambda path, make: asked.append(path))
    assert again.encoders_built()
    build_encoder(again)
    assert asked == [] and again.fast_bpe is first.fast_bpe and again.length_bound == first.length_bound


def test_a_failing_child_leaves_the_build_to_this_process(
    tmp_path: Path, no_build_here: list[str], caplog: pytest.LogCaptureFixture
) -> None:
    tok = Tokenizer.from_path(small_byte_level_tokenizer(tmp_path / "small", "failing"), name="small")
    with caplog.at_level(logging.WARNING, logger="gateway.pipeline.encoder_build"):
        build_encoder(tok, _fail)
    assert no_build_here == ["small"] and tok.fast_bpe is not None
    assert "no plan for" in caplog.text and "building it in this process" in caplog.text


def test_a_tokenizer_without_files_is_built_in_a_thread_here(tmp_path: Path, no_build_here: list[str]) -> None:
    files = small_byte_level_tokenizer(tmp_path / "small", "in-memory")
    tok = Tokenizer(BackendTokenizer.from_file(str(files / "tokenizer.json")), name="in-memory")
    start_build(tok, _fail).join(30)  # the child is never asked
    assert no_build_here == ["in-memory"] and tok.fast_bpe_ready and tok.fast_bpe is not None
    assert tok.encode(TEXTS[0], add_special_tokens=False) == _hf(tok, TEXTS[0])


def test_models_sharing_a_backend_build_it_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = small_byte_level_tokenizer(tmp_path / "small", "together")
    first = Tokenizer.from_path(folder, name="first")
    second = Tokenizer.from_path(folder, name="second")
    second.backend = first.backend  # two models, one parsed backend
    asked: list[str] = []

    def slow_plan(path: str, make: object) -> object:
        asked.append(path)
        time.sleep(0.2)  # the other build arrives meanwhile
        return encoder_build.encoder_facts_at(path)

    monkeypatch.setattr(encoder_build, "plan_in_child", slow_plan)
    threads = [start_build(first), start_build(second)]
    for thread in threads:
        thread.join(30)
    assert len(asked) == 1 and first.fast_bpe is second.fast_bpe is not None
    assert encoder_build._LOCKS == {}  # nothing kept once the builds are done


def test_at_most_two_children_work_at_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tokenizers = [Tokenizer.from_path(small_byte_level_tokenizer(tmp_path / f"m{i}", f"model {i}")) for i in range(5)]
    lock = threading.Lock()
    running: list[int] = [0, 0]  # now, most at once

    def counted_plan(path: str, make: object) -> object:
        with lock:
            running[0] += 1
            running[1] = max(running[1], running[0])
        time.sleep(0.1)
        with lock:
            running[0] -= 1
        return encoder_build.encoder_facts_at(path)

    monkeypatch.setattr(encoder_build, "plan_in_child", counted_plan)
    threads = [start_build(tok) for tok in tokenizers]
    for thread in threads:
        thread.join(30)
    assert running[1] == encoder_build.CHILDREN_AT_ONCE == 2
    assert all(tok.fast_bpe is not None for tok in tokenizers)


@pytest.fixture
def no_whole_parse_here(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Records every parse of a whole tokenizer.json in this process (the child is another
    process: its parses are not seen)."""
    parsed: list[str] = []
    real = BackendTokenizer.from_file

    def spy(path: str) -> BackendTokenizer:
        parsed.append(path)
        return real(path)

    monkeypatch.setattr(encoder_build.BackendTokenizer, "from_file", spy)
    return parsed


def test_a_tokenizer_file_is_read_in_a_child_and_rebuilt_here_from_its_parts(
    tmp_path: Path, no_whole_parse_here: list[str], no_build_here: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = small_byte_level_tokenizer(tmp_path / "small", "parts")
    tok = Tokenizer.from_path(folder, name="small", parse=encoder_build.parse_in_child)
    assert no_whole_parse_here == []  # the file's parse ran in the child only
    # tiktoken applies: the model is built without its merges, the whole one when a text needs it
    assert merges_deferred(tok.backend) and json.loads(tok.backend.to_str())["model"]["merges"] == []
    assert whole(tok.backend).to_str() == Tokenizer.from_path(folder).backend.to_str()
    asked: list[str] = []
    monkeypatch.setattr(encoder_build, "plan_in_child", lambda path, make: asked.append(path))
    build_encoder(tok)  # takes the plan and the bound the same child worked out
    assert asked == [] and no_build_here == [] and encoder_build._PREPARED == {}
    assert tok.fast_bpe is not None and tok.length_bound is not None
    for text in TEXTS:
        assert tok.encode(text, add_special_tokens=False) == _hf(tok, text)


def _no_parts(path: str) -> tuple[None, FastBpePlan | None, LengthBound | None]:
    return None, *encoder_build.encoder_facts_at(path)


def test_a_file_without_parts_is_parsed_whole_here_and_keeps_its_facts(tmp_path: Path, no_whole_parse_here: list[str]) -> None:
    json_file = small_byte_level_tokenizer(tmp_path / "small", "whole") / "tokenizer.json"
    backend = encoder_build.parse_in_child(json_file, _no_parts)
    assert no_whole_parse_here == [str(json_file)]
    assert encoder_build._take_prepared(backend) is not None and encoder_build._take_prepared(backend) is None


def _broken(path: str) -> object:
    raise RuntimeError(f"cannot read {path}")


def test_a_failing_child_leaves_the_parse_to_this_process(
    tmp_path: Path, no_whole_parse_here: list[str], caplog: pytest.LogCaptureFixture
) -> None:
    json_file = small_byte_level_tokenizer(tmp_path / "small", "broken") / "tokenizer.json"
    with caplog.at_level(logging.WARNING, logger="gateway.pipeline.encoder_build"):
        backend = encoder_build.parse_in_child(json_file, _broken)  # type: ignore[arg-type]
    assert no_whole_parse_here == [str(json_file)] and encoder_build._take_prepared(backend) is None
    assert "cannot read" in caplog.text and "parsing it in this process" in caplog.text


def test_kept_facts_are_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(encoder_build, "plan_in_child", lambda path, make: make(path))  # no child: only the bound
    monkeypatch.setattr(encoder_build, "KEPT_PARSES", 0)  # the same file parsed again each time
    json_file = small_byte_level_tokenizer(tmp_path / "small", "bounded") / "tokenizer.json"
    backends = [encoder_build.parse_in_child(json_file, _no_parts) for _ in range(encoder_build.PREPARED_MAX + 2)]
    assert len(encoder_build._PREPARED) == encoder_build.PREPARED_MAX
    assert encoder_build._take_prepared(backends[0]) is None and encoder_build._take_prepared(backends[-1]) is not None
    encoder_build._PREPARED.clear()


def _counting_children(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The child's work done in this process, each file recorded."""
    asked: list[str] = []

    def here(path: str, make: object) -> object:
        asked.append(path)
        return make(path)  # type: ignore[operator]

    monkeypatch.setattr(encoder_build, "plan_in_child", here)
    return asked


def test_the_same_files_again_share_the_backend_and_its_encoders(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A model joining with files parsed before (another name, a worker back after its model
    was removed) makes no native build: no child, no vocabulary, no tiktoken table."""
    asked = _counting_children(monkeypatch)
    first = Tokenizer.from_path(small_byte_level_tokenizer(tmp_path / "a", "same"), name="a", parse=encoder_build.parse_in_child)
    build_encoder(first)
    assert len(asked) == 1 and first.fast_bpe is not None
    again = Tokenizer.from_path(small_byte_level_tokenizer(tmp_path / "b", "same"), name="b", parse=encoder_build.parse_in_child)
    assert again.backend is first.backend and len(asked) == 1
    built_tables: list[object] = []
    monkeypatch.setattr(FastBpePlan, "build", lambda plan, *args: built_tables.append(plan))
    build_encoder(again)
    assert again.fast_bpe is first.fast_bpe and again.length_bound is first.length_bound
    assert built_tables == [] and len(asked) == 1  # the same objects: nothing built again
    for text in TEXTS:
        assert again.encode(text, add_special_tokens=False) == _hf(again, text)


def test_files_that_shape_the_backend_otherwise_get_their_own(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    asked = _counting_children(monkeypatch)
    folder = small_byte_level_tokenizer(tmp_path / "a", "one")
    first = encoder_build.parse_in_child(folder / "tokenizer.json")
    (folder / "tokenizer_config.json").write_text('{"name_or_path": "one", "add_bos_token": false}')
    second = encoder_build.parse_in_child(folder / "tokenizer.json")
    (folder / "special_tokens_map.json").write_text("{}")
    third = encoder_build.parse_in_child(folder / "tokenizer.json")
    assert len({id(first), id(second), id(third)}) == 3 and len(asked) == 3
    assert encoder_build.parse_in_child(folder / "tokenizer.json") is third and len(asked) == 3


def test_kept_parses_are_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _counting_children(monkeypatch)
    backends = [
        encoder_build.parse_in_child(small_byte_level_tokenizer(tmp_path / str(i), str(i)) / "tokenizer.json")
        for i in range(encoder_build.KEPT_PARSES + 1)
    ]
    assert len(encoder_build._KEPT) == encoder_build.KEPT_PARSES
    assert backends[0] not in encoder_build._KEPT.values() and backends[-1] in encoder_build._KEPT.values()


def test_a_vocabulary_past_the_bound_is_refused_and_never_parsed_here(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_whole_parse_here: list[str]
) -> None:
    """A worker may send a tokenizer.json as large as its bound allows; building its model
    holds the serving process's GIL about a second per 400,000 entries: past
    ``--max-vocabulary-entries`` it is refused, in the parts' way and the whole file's."""
    from gateway.pipeline import catalog as catalog_module
    from gateway.tokenization import TokenizerLoadError
    from gateway.tokenization.errors import TokenizerTooLarge

    _counting_children(monkeypatch)
    folder = small_byte_level_tokenizer(tmp_path / "small", "capped")  # 258 entries
    with pytest.raises(TokenizerTooLarge, match="258 entries, more than the 257"):
        encoder_build.parse_in_child(folder / "tokenizer.json", encoder_build.capped_load_facts(257))
    word_level = BackendTokenizer(models.WordLevel({"[UNK]": 0, "a": 1, "b": 2}, unk_token="[UNK]"))
    word_level.save(str(tmp_path / "word_level.json"))  # no parts: parsed whole when it fits
    with pytest.raises(TokenizerTooLarge, match="3 entries, more than the 2"):
        encoder_build.parse_in_child(tmp_path / "word_level.json", encoder_build.capped_load_facts(2))
    assert no_whole_parse_here == []  # neither fell back to a parse in this process
    assert encoder_build.parse_in_child(tmp_path / "word_level.json", encoder_build.capped_load_facts(3)) is not None
    # The catalog's registry parses with its bound, and a refusal is a load error.
    monkeypatch.setattr(catalog_module, "parse_in_child", encoder_build.parse_in_child)
    catalog = catalog_module.ModelCatalog(tmp_path / "cache", max_vocabulary_entries=257)
    with pytest.raises(TokenizerLoadError, match="--max-vocabulary-entries"):
        catalog.registry.load("m", folder, "worker")


def _byte_decoded(folder: Path) -> Path:
    """The small tokenizer with a ``ByteLevel`` decoder (a decode is its ids' bytes)."""
    backend = BackendTokenizer.from_str((folder / "tokenizer.json").read_text())
    backend.decoder = decoders.ByteLevel()
    backend.save(str(folder / "tokenizer.json"))
    return folder


def test_a_joining_models_byte_level_vocabulary_is_kept_in_tables_and_no_model_of_it_built_here(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_whole_parse_here: list[str], no_build_here: list[str]
) -> None:
    """With ``tables`` (a model joining while the helper process encodes) neither the
    vocabulary's BPE model nor tiktoken's table is built here; the whole tokenizer can still
    be built here from the same parts (the helper could not hold it)."""
    _counting_children(monkeypatch)
    folder = _byte_decoded(small_byte_level_tokenizer(tmp_path / "small", "tables"))
    tok = Tokenizer.from_path(folder, name="small", parse=functools.partial(encoder_build.parse_in_child, tables=True))
    assert tok.vocabulary_in_tables and merges_deferred(tok.backend) and no_whole_parse_here == []
    assert len(json.loads(tok.backend.model.__getstate__())["vocab"]) < tok.vocab_size == 258
    tables: list[object] = []
    monkeypatch.setattr(FastBpePlan, "build", lambda plan, *args: tables.append(plan))
    build_encoder(tok)  # the child's bound is taken, its plan is not built
    assert tok.fast_bpe is None and tok.length_bound is not None and tables == [] and no_build_here == []
    assert tok.decode(Tokenizer.from_path(folder).encode("abc ab", add_special_tokens=False)) == "abc ab"
    assert whole(tok.backend).to_str() == Tokenizer.from_path(folder).backend.to_str()
    plain = small_byte_level_tokenizer(tmp_path / "no-decoder", "no-decoder")  # a decode is not its bytes
    backend = encoder_build.parse_in_child(plain / "tokenizer.json", tables=True)
    assert table_of(backend) is None and merges_deferred(backend)  # the vocabulary-only model, as before
