"""`python -m gateway_lab.bench` end to end against the fake OpenAI streamer."""

from __future__ import annotations

import argparse
import json

from gateway_lab.bench import cli

from .fake_openai import FakeState, fake_in_thread


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    return parser.parse_args(list(argv))


def test_compare_two_targets_then_replay_the_trace(tmp_path, capsys) -> None:
    trace, out, png = tmp_path / "w.jsonl", tmp_path / "r.json", tmp_path / "r.png"
    small = ["--groups", "2", "--prompts-per-group", "3", "--system-tokens", "32",
             "--question-tokens", "8", "--output-tokens", "3", "--page-size", "1"]
    with fake_in_thread(FakeState()) as url:
        code = cli.run(_args("--target", f"a={url}", f"b={url}", *small, "--concurrency", "2",
                             "--save-trace", str(trace), "--json", str(out), "--plot", str(png)))
        assert code == 0
        replay = cli.run(_args("--target", f"replay={url}", "--workload", "trace", "--trace", str(trace)))
        assert replay == 0
    data = json.loads(out.read_text())
    assert [r["label"] for r in data["runs"]] == ["a", "b"]
    assert all(r["ok"] == 6 and r["errors"] == 0 for r in data["runs"])
    assert abs(data["runs"][0]["ideal_hit_rate"] - (1 - 112 / 240)) < 0.02 and data["workload"]["groups"] == 2
    assert png.stat().st_size > 0 and len(trace.read_text().splitlines()) == 6
    text = capsys.readouterr().out
    assert "replay" in text and "cache hit rate" in text


def test_chat_ideal_is_rendered_from_what_was_sent(tmp_path) -> None:
    out = tmp_path / "chat.json"
    with fake_in_thread(FakeState()) as url:
        code = cli.run(_args("--target", f"chat={url}", "--workload", "chat", "--conversations", "2",
                             "--turns", "3", "--chat-system-tokens", "8", "--user-tokens", "4",
                             "--reply-tokens", "3", "--page-size", "1", "--json", str(out)))
    assert code == 0
    run = json.loads(out.read_text())["runs"][0]
    assert run["ok"] == 6 and 0.3 < run["ideal_hit_rate"] < 1.0
