"""`token-gateway bench join-holds` (gateway_lab.bench.scenarios.join_holds): a run on a tiny
tokenizer reports every step of both ways of loading it; no timing is asserted."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from tokenizers import Tokenizer as BackendTokenizer
from tokenizers import decoders

from gateway_lab.bench.scenarios import join_holds
from tests.tokenization.helpers import small_byte_level_tokenizer


def test_every_step_of_both_loads_is_reported(tmp_path: Path) -> None:
    folder = small_byte_level_tokenizer(tmp_path / "small")
    backend = BackendTokenizer.from_file(str(folder / "tokenizer.json"))
    backend.decoder = decoders.ByteLevel()  # a decode is its ids' bytes: a joining model keeps it in tables
    backend.save(str(folder / "tokenizer.json"))
    out = tmp_path / "holds.json"
    args = argparse.Namespace(tokenizer_dir=str(folder), repeat=1, json=str(out), markdown="")
    assert join_holds.main(args) == 0
    rows = json.loads(out.read_text())["rows"]
    steps = [row["step"] for row in rows]
    assert steps[0] == "the whole tokenizer.json parsed" and steps[-1] == "of which tiktoken's native CoreBPE constructor"
    assert "the BPE model from the vocabulary and merges" in steps and len(steps) == 14
    where = {row["step"]: row["where"] for row in rows}  # tiktoken applies: the merges wait for a text that needs them
    assert where["the BPE model from the vocabulary alone (merges deferred)"] == join_holds.START_UP
    assert where["the vocabulary in tables: the longest of its steps"] == join_holds.JOINED
    assert where["the BPE model from the vocabulary and merges"].endswith("on the first text tiktoken does not take")
    assert all(row["cpu_ms"] >= 0 for row in rows)


def test_cpu_time_is_the_least_of_the_repeats() -> None:
    calls: list[int] = []
    assert join_holds.cpu_ms(lambda: calls.append(1), 4) >= 0 and len(calls) == 4
