"""A tokenizer.json cut into parts another process parses (tokenization/backend_parts.py):
the tokenizer rebuilt from them is the file's, serialization and ids alike, or there are
no parts."""

from __future__ import annotations

import dataclasses
import json
import pickle
from pathlib import Path

import pytest
from tokenizers import Tokenizer as BackendTokenizer
from tokenizers import models

from gateway.tokenization import backend_parts
from gateway.tokenization.backend_parts import BackendParts, split_backend

from .helpers import small_byte_level_tokenizer

TEXTS = ["Hello, world! It's 12:45.", "L'été à Zürich, 東京 and слово 😀", "<|im_start|>user\nhi<|im_end|>\n", "  \n\t x"]


def _ids(backend: BackendTokenizer, text: str) -> list[int]:
    ids: list[int] = backend.encode(text, add_special_tokens=False).ids
    return ids


def test_the_real_tokenizer_rebuilt_from_its_parts_is_the_same(qwen_dir: Path) -> None:
    text = (qwen_dir / "tokenizer.json").read_text(encoding="utf-8")
    split = split_backend(text)
    assert split is not None
    parts, built_there = split
    assert parts.added and "\x00" in parts.pieces
    whole = BackendTokenizer.from_str(text)
    assert built_there.to_str() == whole.to_str()
    rebuilt = pickle.loads(pickle.dumps(parts)).build()  # what a child sends, rebuilt here
    assert rebuilt.to_str() == whole.to_str()
    assert rebuilt.get_vocab_size(with_added_tokens=True) == whole.get_vocab_size(with_added_tokens=True)
    for text_ in TEXTS:
        assert _ids(rebuilt, text_) == _ids(whole, text_)
        assert rebuilt.decode(_ids(whole, text_), skip_special_tokens=False) == whole.decode(_ids(whole, text_), skip_special_tokens=False)


def test_the_vocabulary_is_rebuilt_in_steps(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(backend_parts, "STEP", 7)  # 258 pieces: many steps, a short last one
    text = (small_byte_level_tokenizer(tmp_path / "small") / "tokenizer.json").read_text()
    split = split_backend(text)
    assert split is not None
    assert split[0].build().to_str() == BackendTokenizer.from_str(text).to_str()


def test_a_model_that_is_not_bpe_has_no_parts() -> None:
    word_piece = BackendTokenizer(models.WordPiece({"[UNK]": 0, "a": 1}, unk_token="[UNK]"))
    assert split_backend(word_piece.to_str()) is None


def test_a_piece_holding_the_separator_or_an_unknown_option_gives_no_parts(tmp_path: Path) -> None:
    data = json.loads((small_byte_level_tokenizer(tmp_path / "small") / "tokenizer.json").read_text())
    with_separator = json.loads(json.dumps(data))
    with_separator["model"]["vocab"]["a\x00b"] = 258
    assert split_backend(json.dumps(with_separator)) is None
    data["model"]["some_future_option"] = True
    assert split_backend(json.dumps(data)) is None
    assert split_backend("{not json") is None


def test_an_added_token_that_would_get_another_id_is_refused(tmp_path: Path) -> None:
    tok = BackendTokenizer.from_file(str(small_byte_level_tokenizer(tmp_path / "small") / "tokenizer.json"))
    tok.add_special_tokens(["<|end|>"])  # id 258, right after the vocabulary
    split = split_backend(tok.to_str())
    assert split is not None
    parts = split[0]
    assert parts.added[0][:2] == (258, "<|end|>")
    wrong = dataclasses.replace(parts, added=((300, "<|end|>", parts.added[0][2]),))
    with pytest.raises(ValueError, match="got id 258, not 300"):
        wrong.build()


def test_parts_are_plain_data() -> None:
    fields = {f.name for f in dataclasses.fields(BackendParts)}
    assert fields == {"shell", "options", "pieces", "ids", "merges", "added"}
