"""`token-gateway bench hostile` (gateway_lab.bench.scenarios.hostile), its parts against
fakes: the bomb template and tokenizer, the /health poller, one probe's row, the table in
the common result format and the exit status (the probes themselves need a gateway process
and run as ``token-gateway bench hostile``)."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import queue
import threading
import time
from collections.abc import AsyncIterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import jinja2
import pytest

from gateway_lab.bench.scenarios import hostile as scenario


def test_the_template_holds_every_bomb_and_picks_one_by_its_key(monkeypatch: pytest.MonkeyPatch) -> None:
    source = scenario.template()
    assert all(bomb in source for bomb in scenario.BOMBS.values()) and scenario.SLOW in source
    # the branches, with harmless stand-ins for the bombs (compiling the real ones takes seconds)
    monkeypatch.setattr(scenario, "BOMBS", {"first": "ONE", "second": "TWO"})
    monkeypatch.setattr(scenario, "SLOW", "SLOW")
    template = jinja2.Environment().from_string(scenario.template())
    messages = [{"role": "user", "content": "hi"}]
    assert template.render(messages=messages) == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert [template.render(messages=messages, bomb=key) for key in ("b0", "b1", "slow")] == ["ONE", "TWO", "SLOW"]


def test_the_bomb_tokenizer_is_a_copy_with_the_template(tmp_path: Path) -> None:
    source = tmp_path / "tok"
    source.mkdir()
    (source / "tokenizer.json").write_text("{}")
    (source / "tokenizer_config.json").write_text(json.dumps({"chat_template": "plain", "eos_token": "x"}))
    folder = scenario.bomb_tokenizer(source, tmp_path / "bomb")
    config = json.loads((folder / "tokenizer_config.json").read_text())
    assert config == {"chat_template": scenario.template(), "eos_token": "x"}
    assert (folder / "tokenizer.json").exists() and json.loads((source / "tokenizer_config.json").read_text())["chat_template"] == "plain"


class _Health(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    connections = 0

    def setup(self) -> None:
        super().setup()
        _Health.connections += 1

    def do_GET(self) -> None:
        body = b'{"status":"ok"}'
        self.wfile.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))  # one segment

    def log_message(self, *args: Any) -> None:
        pass


def test_the_wide_tokenizer_has_the_entries_asked_for_and_is_byte_level_bpe(tmp_path: Path) -> None:
    from tokenizers import Tokenizer as BackendTokenizer

    folder = scenario.wide_tokenizer(tmp_path / "wide", 2_000)
    backend = BackendTokenizer.from_file(str(folder / "tokenizer.json"))
    assert backend.get_vocab_size() == 2_001  # and its EOS
    assert json.loads((folder / "tokenizer_config.json").read_text())["eos_token"] == "<|endoftext|>"
    merges = json.loads((folder / "tokenizer.json").read_text())["model"]["merges"]
    assert len(merges) == 2_000 - 256  # every entry past the bytes is one merge
    text = "hello world, ça va? 東京"
    assert backend.decode(backend.encode(text).ids) == text  # every byte has a token


def test_the_health_poller_keeps_one_connection_and_reports_each_answer() -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Health)
    threading.Thread(target=server.serve_forever, args=(0.01,), daemon=True).start()
    ready, stop, out = threading.Event(), threading.Event(), queue.Queue[list[float]]()
    poller = threading.Thread(target=scenario.probe_health, args=(server.server_port, ready, stop, out, 0.005))
    try:
        poller.start()
        assert ready.wait(5)
        time.sleep(0.15)
        stop.set()
        latencies = out.get(timeout=5)
    finally:
        stop.set()
        poller.join(5)
        server.shutdown()
        server.server_close()
    assert len(latencies) >= 3 and all(0 < s < 1 for s in latencies) and _Health.connections == 1


def test_rss_and_quantiles() -> None:
    now, peak = scenario.rss(os.getpid())
    assert 0 < now <= peak
    assert scenario.quantile([3.0, 1.0, 2.0, 4.0], 0.5) == 3.0 and scenario.quantile([1.0, 9.0], 0.99) == 9.0
    assert scenario.quantile([], 0.5) != scenario.quantile([], 0.5)  # nan: nothing was measured


def test_an_error_answer_is_its_status_and_code() -> None:
    assert scenario.code(httpx.Response(200, json={})) == "200"
    assert scenario.code(httpx.Response(400, json={"error": {"code": "chat_template_budget"}})) == "400 chat_template_budget"
    assert scenario.code(httpx.Response(502, json={"error": {"type": "worker_error"}})) == "502 worker_error"


async def test_a_probe_repeats_its_attack_and_makes_one_row(monkeypatch: pytest.MonkeyPatch) -> None:
    @contextlib.asynccontextmanager
    async def polled(port: int) -> AsyncIterator[list[float]]:
        yield [0.001, 0.002, 0.003]

    monkeypatch.setattr(scenario, "health_probe", polled)
    answers = iter(["400 a", "400 a", "200", "400 a"])

    async def attack() -> str:
        return next(answers)

    prober = scenario.Prober(None, 1, os.getpid(), only="bomb", seconds=0.0)
    await prober.measure("template bomb: x", attack, times=4)
    await prober.measure("worker floods", attack)  # not asked for
    (row,) = prober.rows
    assert (row["probe"], row["answer"], row["times"], row["polls"]) == ("template bomb: x", "400 a", 4, 3)
    assert row["health_p50_ms"] == pytest.approx(2.0) and row["health_max_ms"] == pytest.approx(3.0)
    assert row["peak_mib"] >= row["rss_mib"] > 0


ROW = {"probe": "template bomb: x", "answer": "400 chat_template_budget", "times": 20, "answer_ms": 1.04,
       "health_p50_ms": 0.5, "health_p99_ms": 2.44, "health_max_ms": 5.3, "polls": 100, "rss_mib": 606.2,
       "rss_growth_mib": 0.1, "peak_mib": 869.0}  # fmt: skip


def test_rows_become_the_table_with_the_peak_as_a_note() -> None:
    out = scenario.result([ROW])
    (table,) = out.tables
    assert table.header == scenario.HEADER
    assert table.rows == (("template bomb: x", "400 chat_template_budget (x20)", "1.0 ms", "0.5 ms", "2.4 ms", "5.3 ms",
                           "606 MiB", "+0 MiB"),)  # fmt: skip
    assert out.notes == ["peak RSS (VmHWM) 869 MiB"] and out.data == {"probes": [ROW]}


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    scenario.add_arguments(parser)
    return parser.parse_args(list(argv))


def test_main_writes_the_common_format_and_fails_when_nothing_matched(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    found: list[list[dict[str, Any]]] = [[ROW], []]

    async def fake_run(args: argparse.Namespace) -> list[dict[str, Any]]:
        return found.pop(0)

    monkeypatch.setattr(scenario, "run", fake_run)
    out, md = tmp_path / "h.json", tmp_path / "h.md"
    assert scenario.main(_args("--json", str(out), "--markdown", str(md), "--only", "bomb")) == 0
    written = json.loads(out.read_text())
    assert written["rows"][0]["answer"] == "400 chat_template_budget (x20)" and written["probes"] == [ROW]
    assert "machine" in written and "| template bomb: x |" in md.read_text()
    assert scenario.main(_args("--only", "nothing like this")) == 1
    assert (_args().probe_seconds, _args().only, _args().ready_timeout_s, _args().log_dir) == (2.0, "", 180.0, "")
