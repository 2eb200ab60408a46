"""`token-gateway inspect` offline: every prompt source, tables, JSON, and clear errors."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from gateway.cli import main
from gateway.policies import PolicyConfig, RouteRequest, WorkerView, make_policy
from gateway.policies.hashing import block_hashes, prefix_key

URLS = ["grpc://127.0.0.1:7001", "grpc://127.0.0.1:7002", "127.0.0.1:7003"]
IDS = ["127.0.0.1:7001", "127.0.0.1:7002", "127.0.0.1:7003"]
MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name three rivers."}]


def run_json(capsys: pytest.CaptureFixture[str], *argv: str) -> dict:
    assert main(["inspect", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_text_offline_maps_like_the_prefix_hash_policy(capsys: pytest.CaptureFixture[str]) -> None:
    text = "The quick brown fox jumps over the lazy dog. " * 12
    out = run_json(capsys, text, "--workers", *URLS, "--block-size", "8", "--depth", "64")
    ids = [t["id"] for t in out["tokens"]]
    assert out["token_count"] == len(ids) > 64 and out["source"] == "offline" and out["text"] == text
    assert all(t["piece"] for t in out["tokens"])
    assert [b["hash"] for b in out["blocks"]] == [b.hash for b in block_hashes(ids, 8)]
    assert out["ring"]["key"] == prefix_key(ids, 8, 64) and out["ring"]["depth_tokens"] == 64
    policy = make_policy(PolicyConfig(policy="prefix_hash", hash_block_size=8, hash_depth_tokens=64))
    views = [WorkerView(worker_id=i, url=f"grpc://{i}") for i in IDS]
    assert policy.select(RouteRequest(token_ids=ids), views).worker_id == out["ring"]["owner"]
    assert out["decision"]["choice"] == out["ring"]["owner"]
    assert sorted(out["ring"]["order"]) == IDS


def test_messages_file_and_stdin_agree(capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    direct = run_json(capsys, "--messages", json.dumps(MESSAGES), "--workers", *URLS)
    assert direct["text"].startswith("<|im_start|>system\nBe brief.")
    assert direct["text"].endswith("<|im_start|>assistant\n")
    f = tmp_path / "chat.json"
    f.write_text(json.dumps({"messages": MESSAGES}))
    from_file = run_json(capsys, "--file", str(f), "--workers", *URLS)
    assert from_file["tokens"] == direct["tokens"] and from_file["ring"] == direct["ring"]
    # thinking switched off through the template kwargs changes the rendered prompt
    off = run_json(capsys, "--file", str(f), "--chat-template-kwargs", '{"enable_thinking": false}')
    assert off["text"] != direct["text"] and "<think>" in off["text"]
    assert off["ring"] is None and any("--workers" in n for n in off["notes"])

    txt = tmp_path / "prompt.txt"
    txt.write_text("plain text prompt\nover two lines")
    plain = run_json(capsys, "--file", str(txt))
    monkeypatch.setattr("sys.stdin", io.StringIO("plain text prompt\nover two lines"))
    stdin = run_json(capsys, "--file", "-")
    assert plain["tokens"] == stdin["tokens"] and plain["text"] == "plain text prompt\nover two lines"


def test_input_ids_and_tables(capsys: pytest.CaptureFixture[str]) -> None:
    ids = list(range(1000, 1040))
    out = run_json(capsys, "--input-ids", ",".join(map(str, ids)), "--workers", *URLS, "--policy", "consistent_hash")
    assert [t["id"] for t in out["tokens"]] == ids and out["text"] is None
    assert out["policy"] == "consistent_hash" and out["decision"]["choice"] in IDS

    assert main(["inspect", "--input-ids", " ".join(map(str, ids)), "--workers", *URLS, "--rows", "5"]) == 0
    table = capsys.readouterr().out
    assert "prefix_hash ring" in table and "35 more tokens" in table and "chained block hashes" in table
    assert "owner" in table and out["ring"]["owner"] in table


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        ([], "exactly one prompt"),
        (["a", "--input-ids", "1"], "exactly one prompt"),
        (["--messages", "{not json"], "not valid JSON"),
        (["--messages", '"a string"'], "list of messages"),
        (["--messages", "[]"], "at least one message"),
        (["--input-ids", "1,,x"], "integers"),
        (["--input-ids", "999999999"], "input_ids must be in"),
        (["--file", "/nonexistent/prompt.txt"], "cannot read"),
        (["a", "--workers", "ftp://127.0.0.1:1"], "bad worker url"),
        (["a", "--tokenizer-path", "/nonexistent/tok"], "does not exist"),
        (["a", "--chat-template-kwargs", "[1]"], "JSON object"),
        (["a", "--gateway", "http://127.0.0.1:9", "--workers", "127.0.0.1:1"], "offline use"),
    ],
)
def test_bad_input_exits_2_with_one_line(capsys: pytest.CaptureFixture[str], argv: list[str], needle: str) -> None:
    assert main(["inspect", *argv]) == 2
    err = capsys.readouterr().err
    assert needle in err and err.startswith("token-gateway inspect:")


def test_unreachable_gateway(capsys: pytest.CaptureFixture[str]) -> None:
    import socket

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    assert main(["inspect", "hi", "--gateway", f"http://127.0.0.1:{port}", "--timeout", "5"]) == 2
    assert "cannot reach the gateway" in capsys.readouterr().err


def test_tokenizer_from_path_or_the_serve_cache(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    import shutil

    from gateway.tokenization import cache_dirname
    from gateway_lab.bench.workloads import default_tokenizer_dir

    qwen = default_tokenizer_dir()
    default = run_json(capsys, "hello world")
    by_path = run_json(capsys, "hello world", "--tokenizer-path", str(qwen / "tokenizer.json"), "--model", "m1")
    assert by_path["tokens"] == default["tokens"] and by_path["model"] == "m1"
    cache = tmp_path / "cache"
    shutil.copytree(qwen, cache / cache_dirname("org/my-model"))
    cached = run_json(capsys, "hello world", "--model", "org/my-model", "--tokenizer-cache-dir", str(cache))
    assert cached["tokens"] == default["tokens"] and cached["model"] == "org/my-model"
    assert any(str(cache) in n for n in cached["notes"]) and not any(str(cache) in n for n in default["notes"])
