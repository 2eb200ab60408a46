"""The tokenizer helper process (pipeline/tokenizer_helper.py): it holds the whole
tokenizer of a model whose merges were put off and encodes what tiktoken does not take,
with the ids of the whole tokenizer; a helper that dies or hangs fails only the call it
held, with a 503 naming it, and the next call gets a new one that holds every tokenizer
again. Real spawned processes."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tokenizers import Tokenizer as BackendTokenizer
from tokenizers import decoders

from gateway.pipeline.tokenizer_helper import HelperFailed, TokenizerHelper
from gateway.tokenization import Tokenizer, backend_parts
from gateway.tokenization.backend_parts import merges_later, split_backend
from gateway.tokenization.fast_bpe import plan_fast_bpe
from gateway.tokenization.vocabulary_table import table_backend, table_of
from tests.tokenization.helpers import small_byte_level_tokenizer

TEXTS = ["東京の天気は", "Hello 東京 and слово 😀 more words", "<|im_start|>user\n你好<|im_end|>\n", "plain ascii", ""]


class _Sleeps:
    """Unpickled in the helper as a sleep of ``seconds``: a call the helper holds that long."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def __reduce__(self) -> tuple[Any, tuple[float]]:
        return time.sleep, (self.seconds,)


def _deferred(folder: Path) -> tuple[Tokenizer, Tokenizer]:
    """(the tokenizer as a joining model gets it, without its merges; the files parsed whole)."""
    full = Tokenizer.from_path(folder)
    split = split_backend((folder / "tokenizer.json").read_text(encoding="utf-8"))
    plan = plan_fast_bpe(full.backend)
    assert split is not None and plan is not None
    tok = Tokenizer.from_path(folder, parse=lambda _: merges_later(split[0]))
    assert tok.install_encoders(plan, None) is not None
    return tok, full


def _in_tables(folder: Path) -> tuple[Tokenizer, Tokenizer]:
    """(the tokenizer as a model joining with a helper gets it: its vocabulary in tables, no
    model of it here; the files parsed whole), for a byte-level tokenizer."""
    backend = BackendTokenizer.from_file(str(folder / "tokenizer.json"))
    backend.decoder = decoders.ByteLevel()
    backend.save(str(folder / "tokenizer.json"))
    full = Tokenizer.from_path(folder)
    split = split_backend((folder / "tokenizer.json").read_text(encoding="utf-8"))
    assert split is not None
    tok = Tokenizer.from_path(folder, parse=lambda _: table_backend(split[0]))  # type: ignore[arg-type,return-value]
    assert tok.vocabulary_in_tables and tok.install_encoders(None, None) is None
    return tok, full


@pytest.fixture
def helper() -> Iterator[TokenizerHelper]:
    found = TokenizerHelper(timeout_s=20.0)
    yield found
    found.close()


def _wait_until(check: Any, seconds: float = 20.0) -> None:
    ends = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < ends, "timed out"
        time.sleep(0.01)


def _small_with_bos(folder: Path) -> Path:
    """The small tokenizer with a special token its config adds as BOS (a post-processor
    this process rebuilt, which the helper must use too)."""
    small_byte_level_tokenizer(folder)
    backend = BackendTokenizer.from_file(str(folder / "tokenizer.json"))
    backend.add_special_tokens(["<|im_start|>", "<|im_end|>"])
    backend.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({"add_bos_token": True, "bos_token": "<|im_start|>"}))
    return folder


def test_the_helper_encodes_with_the_whole_tokenizer_which_is_never_built_here(helper: TokenizerHelper, tmp_path: Path) -> None:
    tok, full = _deferred(_small_with_bos(tmp_path / "bos"))
    assert full.encode("ab", add_special_tokens=True)[0] == full.backend.token_to_id("<|im_start|>")
    assert helper.attach(tok)
    assert not helper.attach(tok)  # held already
    assert not helper.attach(full)  # nothing put off
    assert helper.pid is not None and helper.pid != os.getpid()
    for text in TEXTS:
        for special in (False, True):
            assert tok.encode(text, add_special_tokens=special) == full.encode(text, add_special_tokens=special), text
    assert tok.encode_batch(TEXTS, add_special_tokens=True) == full.encode_batch(TEXTS, add_special_tokens=True)
    assert tok.special_text.plain_ids(["<|im_end|>"]) == full.special_text.plain_ids(["<|im_end|>"])
    assert tok.backend not in backend_parts._WHOLE


def test_a_joined_models_texts_all_go_to_the_helper_when_its_vocabulary_is_in_tables(
    helper: TokenizerHelper, tmp_path: Path
) -> None:
    tok, full = _in_tables(_small_with_bos(tmp_path / "bos"))
    assert helper.attach(tok) and tok.merges_elsewhere
    for text in [*TEXTS, "abc ab", "<|im_start|>abc"]:
        assert tok.encodes_elsewhere(text)
        for special in (False, True):
            assert tok.encode(text, add_special_tokens=special) == full.encode(text, add_special_tokens=special), text
        ids = full.encode(text, add_special_tokens=True)
        assert tok.decode(ids, skip_special_tokens=False) == full.decode(ids, skip_special_tokens=False)
    assert tok.token_id("abc") == full.token_id("abc") == 257
    table = table_of(tok.backend)
    assert table is not None and table.unreached == set()  # told at the join: every piece is reached
    assert tok.backend not in backend_parts._WHOLE


@pytest.mark.parametrize("joined", [_deferred, _in_tables], ids=["merges put off", "vocabulary in tables"])
def test_a_helper_that_dies_fails_only_the_call_it_held_and_the_next_one_holds_every_tokenizer_again(
    helper: TokenizerHelper, tmp_path: Path, joined: Any
) -> None:
    tok, full = joined(small_byte_level_tokenizer(tmp_path / "small"))
    assert helper.attach(tok)
    first = helper.pid
    assert first is not None
    held: list[BaseException] = []
    queued: list[list[int]] = []

    def hold_a_call() -> None:
        try:
            helper.encode("m1", [_Sleeps(30)], False, False)  # type: ignore[list-item]
        except BaseException as exc:
            held.append(exc)

    holder = threading.Thread(target=hold_a_call)
    holder.start()
    _wait_until(lambda: helper._pending == 1)
    waiter = threading.Thread(target=lambda: queued.append(tok.encode("東京 ab", add_special_tokens=False)))
    waiter.start()  # waits its turn behind the held call
    _wait_until(lambda: helper._pending == 2)
    os.kill(first, signal.SIGKILL)
    holder.join(30)
    waiter.join(30)
    assert len(held) == 1 and isinstance(held[0], HelperFailed)
    assert held[0].status == 503 and held[0].code == "tokenizer_helper_failed" and "died" in held[0].message
    assert queued == [full.encode("東京 ab", add_special_tokens=False)]  # the call behind it: served by a new helper
    assert helper.pid not in (None, first) and helper.restarts == 1
    assert tok.encode("Привет", add_special_tokens=False) == full.encode("Привет", add_special_tokens=False)


def test_a_helper_killed_between_calls_is_started_again_without_failing_any(helper: TokenizerHelper, tmp_path: Path) -> None:
    tok, full = _deferred(small_byte_level_tokenizer(tmp_path / "small"))
    assert helper.attach(tok)
    first = helper.pid
    assert first is not None
    os.kill(first, signal.SIGKILL)
    _wait_until(lambda: helper._helper is not None and not helper._helper.process.is_alive())
    assert tok.encode("東京", add_special_tokens=False) == full.encode("東京", add_special_tokens=False)
    assert helper.pid != first


def test_a_stuck_helper_is_killed_after_its_timeout_and_a_busy_one_refuses_more_calls(tmp_path: Path) -> None:
    helper = TokenizerHelper(timeout_s=1.0, max_pending=1)
    try:
        tok, full = _deferred(small_byte_level_tokenizer(tmp_path / "small"))
        assert helper.attach(tok)
        first = helper.pid
        stuck: list[BaseException] = []

        def hold_a_call() -> None:
            try:
                helper.encode("m1", [_Sleeps(30)], False, False)  # type: ignore[list-item]
            except BaseException as exc:
                stuck.append(exc)

        holder = threading.Thread(target=hold_a_call)
        holder.start()
        _wait_until(lambda: helper._pending == 1)
        with pytest.raises(HelperFailed) as busy:
            tok.encode("東京", add_special_tokens=False)
        assert busy.value.code == "tokenizer_busy" and busy.value.status == 503
        holder.join(30)
        assert len(stuck) == 1 and isinstance(stuck[0], HelperFailed) and "did not answer in 1 s" in stuck[0].message
        assert tok.encode("東京", add_special_tokens=False) == full.encode("東京", add_special_tokens=False)
        assert helper.pid != first and helper.restarts == 1
    finally:
        helper.close()
    with pytest.raises(HelperFailed, match="shutting down"):
        tok.encode("東京", add_special_tokens=False)


def test_a_collected_tokenizer_is_let_go_at_the_next_call(helper: TokenizerHelper, tmp_path: Path) -> None:
    first, _ = _deferred(small_byte_level_tokenizer(tmp_path / "one", name="one"))
    second, full = _deferred(small_byte_level_tokenizer(tmp_path / "two", name="two"))
    assert helper.attach(first) and helper.attach(second)
    helper._release("m1")  # what the collector calls: no call to the helper from there
    assert set(helper._held) == {"m1", "m2"}
    assert second.encode("東京", add_special_tokens=False) == full.encode("東京", add_special_tokens=False)
    assert set(helper._held) == {"m2"}
    with pytest.raises(HelperFailed, match="could not do it"):
        helper.encode("m1", ["東京"], False, False)
