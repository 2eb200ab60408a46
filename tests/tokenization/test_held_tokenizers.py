"""What the tokenizer helper process runs (tokenization/held_tokenizers.py), called in this
process: a tokenizer held from its parts encodes as the file's own tokenizer does, the
plain copy reads special-token strings as text, the packed answer unpacks to the same
ids, and a released key is gone."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from tokenizers import Tokenizer as BackendTokenizer

from gateway.tokenization import held_tokenizers
from gateway.tokenization.backend_parts import split_backend
from tests.tokenization.helpers import small_byte_level_tokenizer

TEXTS = ["abc ab", "Привет 😀 abcab", "", "<|im_start|>abc"]


def _parts_and_file(tmp_path: Path) -> tuple[object, BackendTokenizer]:
    folder = small_byte_level_tokenizer(tmp_path)
    text = (folder / "tokenizer.json").read_text(encoding="utf-8")
    split = split_backend(text)
    assert split is not None
    return split[0], BackendTokenizer.from_str(text)


def test_a_held_tokenizer_encodes_as_the_file_does_and_is_released(tmp_path: Path) -> None:
    parts, original = _parts_and_file(tmp_path)
    assert held_tokenizers.hold("t1", parts, original.post_processor) == os.getpid()  # type: ignore[arg-type]
    try:
        packed = held_tokenizers.encode_held("t1", TEXTS, False, False)
        assert held_tokenizers.unpack(packed) == [e.ids for e in original.encode_batch(TEXTS, add_special_tokens=False)]
        assert held_tokenizers.unreached("t1") == b""  # the small vocabulary's model reaches every piece
    finally:
        held_tokenizers.release("t1")
    with pytest.raises(KeyError):
        held_tokenizers.encode_held("t1", TEXTS, False, False)
    with pytest.raises(KeyError):
        held_tokenizers.unreached("t1")
    held_tokenizers.release("t1")  # releasing twice is harmless


def test_the_plain_copy_reads_special_token_strings_as_text(tmp_path: Path) -> None:
    parts, original = _parts_and_file(tmp_path)
    original.add_special_tokens(["<|im_start|>"])
    special = original.token_to_id("<|im_start|>")
    held_tokenizers.hold("t2", parts, original.post_processor)  # type: ignore[arg-type]
    try:
        backend = held_tokenizers._HELD["t2"][0]
        assert backend is not None
        backend.add_special_tokens(["<|im_start|>"])
        [as_special] = held_tokenizers.unpack(held_tokenizers.encode_held("t2", ["<|im_start|>ab"], False, False))
        [as_text] = held_tokenizers.unpack(held_tokenizers.encode_held("t2", ["<|im_start|>ab"], False, True))
    finally:
        held_tokenizers.release("t2")
    assert special is not None and special in as_special and special not in as_text
    assert len(as_text) > len(as_special)


def test_unpack_keeps_empty_texts_and_order() -> None:
    from array import array

    counts, ids = array("I", [2, 0, 3]), array("I", [5, 6, 7, 8, 9])
    assert held_tokenizers.unpack((counts.tobytes(), ids.tobytes())) == [[5, 6], [], [7, 8, 9]]
