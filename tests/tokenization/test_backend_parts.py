"""A tokenizer.json cut into parts another process parses (tokenization/backend_parts.py):
the tokenizer rebuilt from them is the file's, serialization and ids alike, or there are
no parts."""

from __future__ import annotations

import dataclasses
import json
import pickle
import random
from pathlib import Path

import pytest
from tokenizers import Tokenizer as BackendTokenizer
from tokenizers import models, processors

from gateway.tokenization import Tokenizer, backend_parts
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


def test_a_tokenizer_without_its_merges_decodes_and_looks_up_as_the_whole_one(qwen_dir: Path, qwen: Tokenizer) -> None:
    """Decoding and id/token look-ups read the vocabulary alone: the same for every id, the
    added and special ones included, special tokens skipped and kept."""
    split = split_backend((qwen_dir / "tokenizer.json").read_text(encoding="utf-8"))
    assert split is not None
    later = backend_parts.merges_later(split[0])
    full = qwen.backend
    assert json.loads(later.to_str())["model"]["merges"] == []
    assert later.get_vocab_size(with_added_tokens=True) == full.get_vocab_size(with_added_tokens=True)
    assert later.get_added_tokens_decoder() == full.get_added_tokens_decoder()
    size = full.get_vocab_size(with_added_tokens=True)
    assert [later.id_to_token(i) for i in range(size)] == [full.id_to_token(i) for i in range(size)]
    rnd = random.Random(7)
    specials = sorted(full.get_added_tokens_decoder())
    for _ in range(1500):
        ids = [rnd.choice(specials) if rnd.random() < 0.1 else rnd.randrange(size) for _ in range(rnd.randint(1, 40))]
        for skip in (True, False):
            assert later.decode(ids, skip_special_tokens=skip) == full.decode(ids, skip_special_tokens=skip)
    for text in TEXTS:  # real ids too (whole UTF-8 sequences, where random ids mostly cut them)
        ids = _ids(full, text)
        assert later.decode(ids, skip_special_tokens=False) == full.decode(ids, skip_special_tokens=False)


def test_the_whole_tokenizer_is_built_once_on_first_ask_with_the_current_post_processor(tmp_path: Path) -> None:
    text = (small_byte_level_tokenizer(tmp_path / "small") / "tokenizer.json").read_text()
    split = split_backend(text)
    assert split is not None
    file_parse = BackendTokenizer.from_str(text)
    assert backend_parts.whole(file_parse) is file_parse and not backend_parts.merges_deferred(file_parse)
    later = backend_parts.merges_later(split[0])
    assert backend_parts.merges_deferred(later) and later not in backend_parts._WHOLE
    assert _ids(later, "abc") != _ids(file_parse, "abc")  # no merges: bytes apart
    later.post_processor = processors.TemplateProcessing(single="abc $A", special_tokens=[("abc", 257)])
    built = backend_parts.whole(later)
    assert backend_parts.whole(later) is built and backend_parts.merges_deferred(later)
    assert later not in backend_parts._LATER  # the parts are let go once the whole one is built
    assert built.encode("abc ab", add_special_tokens=False).ids == _ids(file_parse, "abc ab")
    assert built.encode("abc ab", add_special_tokens=True).ids == [257, *_ids(file_parse, "abc ab")]
    assert backend_parts.whole_encoder(later)("abc ab") == _ids(file_parse, "abc ab")
