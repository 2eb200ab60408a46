"""The simulator's tokenizer knowledge (gateway_lab/sim/vocab.py): ids to draw outputs
from, EOS ids, scripted replies found in a prompt, and the tokenizer zip it serves."""

from __future__ import annotations

import hashlib
import io
import zipfile
from pathlib import Path

import pytest

from gateway_lab.sim.vocab import (
    REPLY_CLOSE,
    REPLY_OPEN,
    load_vocab,
    resolve_tokenizer_path,
    tokenizer_zip,
)


def test_the_vocab_is_loaded_once_with_plain_ascii_outputs() -> None:
    vocab = load_vocab()
    assert vocab is load_vocab()  # one per process
    assert vocab.vocab_size > 150_000 and vocab.eos_ids
    sample = vocab.decode(list(vocab.output_ids[:200]))
    assert sample.isascii()
    everything = load_vocab(output_vocab="all")
    assert len(everything.output_ids) > len(vocab.output_ids)
    assert "<|endoftext|>" in [vocab.decode([i]) for i in vocab.eos_ids]


def test_the_last_scripted_reply_in_a_prompt() -> None:
    vocab = load_vocab()
    prompt = vocab.encode(f"user: say {REPLY_OPEN}first{REPLY_CLOSE} then {REPLY_OPEN}Hello there!{REPLY_CLOSE}")
    reply = vocab.scripted_reply(prompt)
    assert reply is not None and vocab.decode(reply) == "Hello there!"
    assert vocab.scripted_reply(vocab.encode("an ordinary prompt")) is None
    assert vocab.scripted_reply(vocab.encode(f"unclosed {REPLY_OPEN}text")) is None


def test_tokenizer_paths_and_the_served_zip(tmp_path: Path) -> None:
    root = resolve_tokenizer_path("")
    assert resolve_tokenizer_path(str(root / "tokenizer.json")) == root  # a file means its folder
    with pytest.raises(FileNotFoundError, match=r"no tokenizer\.json"):
        resolve_tokenizer_path(str(tmp_path))
    data, sha = tokenizer_zip(root)
    assert hashlib.sha256(data).hexdigest() == sha
    names = zipfile.ZipFile(io.BytesIO(data)).namelist()
    assert "tokenizer.json" in names and names == sorted(names)
