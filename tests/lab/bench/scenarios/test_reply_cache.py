"""`token-gateway bench reply-cache` (gateway_lab.bench.scenarios.reply_cache): the
conversation it replays, both modes tokenizing every turn, and a tiny run."""

from __future__ import annotations

import argparse
import random

import pytest

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


def test_a_tiny_run(capsys: pytest.CaptureFixture[str]) -> None:
    parser = argparse.ArgumentParser()
    scenario.add_arguments(parser)
    assert scenario.main(parser.parse_args(["--conversations", "2", "--repeat", "1"])) == 0
    out = capsys.readouterr().out.splitlines()
    assert [line.split(":")[0] for line in out] == ["reply token reuse off", "reply token reuse on "]
    assert all("12 requests" in line for line in out)
