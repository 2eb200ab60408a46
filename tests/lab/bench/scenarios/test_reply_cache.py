"""`token-gateway bench reply-cache` (gateway_lab.bench.scenarios.reply_cache): the
conversation it replays, both modes tokenizing every turn, and a tiny run."""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

from gateway.tokenization import Tokenizer
from gateway_lab.bench import workloads as wl
from gateway_lab.bench.scenarios import reply_cache as scenario


def test_six_turns_each_resending_the_replies_and_both_modes_tokenize_them_all() -> None:
    tok = Tokenizer.from_path(wl.default_tokenizer_dir(), name="Qwen/Qwen3-0.6B")
    vocab = wl.Vocab.from_tokenizer_dir(str(wl.default_tokenizer_dir()))
    turns = scenario.conversation(tok, vocab, random.Random(0))
    assert len(turns) == 6
    last_messages, reply, ids = turns[-1]
    assert [m["role"] for m in last_messages] == ["system"] + ["user", "assistant"] * 5 + ["user"]
    assert len(ids) == 64 and reply
    for reuse in (False, True):
        cpu, n = scenario.run(tok, [turns], reuse)
        assert n == 6 and cpu >= 0


def test_a_tiny_run(tmp_path: Path) -> None:
    parser = argparse.ArgumentParser()
    scenario.add_arguments(parser)
    out = tmp_path / "r.json"
    assert scenario.main(parser.parse_args(["--conversations", "2", "--repeat", "1", "--json", str(out)])) == 0
    rows = json.loads(out.read_text())["rows"]
    assert [r["reply token reuse"] for r in rows] == ["off", "on"] and all(r["requests"] == "12" for r in rows)
