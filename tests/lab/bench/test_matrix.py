"""`token-gateway bench matrix` end to end at toy sizes: in-process fleet + gateway + oracle."""

from __future__ import annotations

import argparse
import json

import pytest

from gateway.cli import build_parser
from gateway_lab.bench import matrix
from gateway_lab.bench.peers import peer_argv

ZERO_COST = ["--step-base-s", "0", "--prefill-token-s", "0", "--decode-seq-s", "0", "--time-scale", "0"]
TINY = [
    "--groups", "3", "--prompts-per-group", "4", "--system-tokens", "64", "--question-tokens", "16",
    "--output-tokens", "2",
    "--conversations", "2", "--turns", "2", "--chat-system-tokens", "48", "--user-tokens", "8", "--reply-tokens", "2",
]  # fmt: skip


def _args(*argv: str) -> argparse.Namespace:
    return build_parser().parse_args(["bench", "matrix", *argv])


@pytest.mark.slow  # six cells, each a fresh fleet and gateway: ~15-25 s
def test_matrix_every_cell_runs_and_the_oracle_reads_the_true_caches(tmp_path, capsys) -> None:
    out, md = tmp_path / "m.json", tmp_path / "m.md"
    args = _args(
        "--workloads", "gsp", "chat", "--workers", "2", "--policies", "round_robin", "cache_aware", "oracle",
        "--per-worker-concurrency", "1",
        "--json", str(out), "--markdown", str(md), *ZERO_COST, *TINY,
    )  # fmt: skip
    assert matrix.run(args) == 0
    data = json.loads(out.read_text())
    cells = {(c["workload"], c["policy"]): c for c in data["cells"]}
    assert set(cells) == {(w, p) for w in ("gsp", "chat") for p in ("round_robin", "cache_aware", "oracle")}
    expected = {"gsp": 12, "chat": 4}
    for (workload, _), cell in cells.items():
        s = cell["summary"]
        assert s["ok"] == expected[workload] and s["errors"] == 0 and s["not_sent"] == 0
        assert 0.0 < s["ideal_hit_rate"] < 1.0
        # the gateway's usage figures and the workers' own counters agree
        assert s["hit_rate"] == pytest.approx(cell["sim"]["worker_hit_rate"])
        assert sum(s["spread"]["per_worker"].values()) == expected[workload]
    # gsp: 3 groups on 2 workers; round robin sends every group to both, the oracle keeps them
    assert cells[("gsp", "oracle")]["summary"]["hit_rate"] > cells[("gsp", "round_robin")]["summary"]["hit_rate"]
    assert cells[("gsp", "oracle")]["summary"]["hit_rate"] <= cells[("gsp", "oracle")]["summary"]["ideal_hit_rate"]
    assert data["machine"]["cpus"] >= 1 and data["workloads"]["gsp"]["groups"] == 3
    text = md.read_text()
    assert "| workers | policy | hit rate (ideal) |" in text
    assert "#### scaling" in text and "| gsp | 2 |" in text and "| chat | 2 |" in text
    printed = capsys.readouterr().out
    assert "oracle" in printed and "[6/6]" in printed and "long-mix" not in printed


def test_bench_subcommands_parse() -> None:
    args = build_parser().parse_args(["bench", "run", "--target", "a=http://127.0.0.1:1", "--workload", "chat"])
    assert args._bench_module == "gateway_lab.bench.cli" and args.target == ["a=http://127.0.0.1:1"]
    args = _args("--workers", "4", "8")
    assert args._bench_module == "gateway_lab.bench.matrix" and args.workers == [4, 8]
    assert args.groups == matrix.MATRIX_GSP.groups  # the matrix's own workload sizes


def test_bad_matrix_arguments_are_refused(tmp_path) -> None:
    with pytest.raises(SystemExit, match="bad --policies"):
        matrix.run(_args("--policies", "nope"))
    with pytest.raises(SystemExit, match=r"peers\.sh"):
        matrix.run(_args("--peers", "smg", "--peers-python", str(tmp_path / "missing" / "python")))
    with pytest.raises(SystemExit, match="multiples of --dp-size"):
        matrix.run(_args("--workers", "6", "--dp-size", "4"))
    with pytest.raises(SystemExit, match="without the oracle"):
        matrix.run(_args("--workers", "8", "--dp-size", "4", "--policies", "oracle"))


def test_dp_ranks_count_as_workers() -> None:
    config = matrix.MatrixConfig(dp_size=4, workers=[8])
    assert matrix.sim_config(config).dp_size == 4


def test_peer_command_line() -> None:
    argv = peer_argv("py", "smg", ["grpc://127.0.0.1:1", "grpc://127.0.0.1:2"], "cache_aware", "/tok", 9000, 9001)
    assert argv[:4] == ["py", "-m", "smg", "launch"]
    assert argv[argv.index("--worker-urls") + 1 : argv.index("--worker-urls") + 3] == [
        "grpc://127.0.0.1:1", "grpc://127.0.0.1:2",
    ]  # fmt: skip
    assert argv[argv.index("--policy") + 1] == "cache_aware" and argv[argv.index("--port") + 1] == "9000"
    with pytest.raises(ValueError):
        peer_argv("py", "smg", [], "oracle", "/tok", 1, 2)
    with pytest.raises(ValueError):
        peer_argv("py", "vllm-router", [], "cache_aware", "/tok", 1, 2)


def test_our_gateway_can_run_as_its_own_process() -> None:
    args = _args("--gateway", "ours-process")
    assert args.gateway == "ours-process"


def _peer_cell(gateway: str, rnd: int, req_s: float, p50: float, p99: float) -> matrix.Cell:
    from gateway_lab.bench.report import RunSummary

    summary = RunSummary(
        label=gateway, workload=matrix.PEER_WORKLOAD, requests=10, ok=10, errors=0, not_sent=0, wall_s=1.0,
        prompt_tokens=100, completion_tokens=10, cached_tokens=50, hit_rate=0.5, ideal_hit_rate=0.6,
        worker_hit_rate=0.5, output_tok_s=10.0, total_tok_s=110.0, req_s=req_s, ttft_p50_s=p50, ttft_p99_s=p99,
        latency_p50_s=p50, latency_p99_s=p99, spread=None,
    )  # fmt: skip
    return matrix.Cell(matrix.PEER_WORKLOAD, 8, "cache_aware", gateway, summary, round=rnd)


def test_the_peer_comparison_gives_requests_per_s_per_round_and_a_stall_line() -> None:
    cells = [
        _peer_cell("ours-process", 1, 40.0, 0.1, 0.3), _peer_cell("smg", 1, 30.0, 0.1, 0.4),
        _peer_cell("smg", 2, 30.0, 0.1, 2.0), _peer_cell("ours-process", 2, 20.0, 0.1, 0.3),
    ]  # fmt: skip
    rows = matrix.peer_rows(cells)
    assert [r[:2] for r in rows] == [["1", "ours-process"], ["1", "smg"], ["2", "smg"], ["2", "ours-process"]]
    assert rows[1][4] == "30.0 (0.75x)" and rows[2][4] == "30.0 (1.50x)"  # against ours in the same round
    lines = matrix.peer_stalls(cells, 10.0)
    assert lines[0] == "peers round 1 (ours-process then smg), cache_aware: no stall"
    assert lines[1].startswith("peers round 2 (smg then ours-process), cache_aware: STALLED: smg: TTFT p99 2,000 ms")


@pytest.mark.slow  # two cells over simulated SGLang HTTP workers: ~5-10 s
def test_matrix_cells_over_sglang_http_workers(tmp_path) -> None:
    out = tmp_path / "m.json"
    args = _args(
        "--workloads", "gsp", "--workers", "2", "--policies", "round_robin", "cache_aware", "--worker-transport", "http",
        "--per-worker-concurrency", "1", "--json", str(out), *ZERO_COST, *TINY,
    )  # fmt: skip
    assert matrix.run(args) == 0
    cells = {c["policy"]: c for c in json.loads(out.read_text())["cells"]}
    for cell in cells.values():
        assert cell["summary"]["ok"] == 12 and cell["summary"]["hit_rate"] == pytest.approx(cell["sim"]["worker_hit_rate"])
    assert cells["cache_aware"]["summary"]["hit_rate"] > cells["round_robin"]["summary"]["hit_rate"]
    with pytest.raises(SystemExit, match="without the oracle"):
        matrix.run(_args("--worker-transport", "http", "--policies", "oracle"))
    with pytest.raises(SystemExit, match="needs --peers"):
        matrix.run(_args("--peers-only"))


def test_the_peer_comparison_runs_gsp_as_text_or_the_multi_turn_chat() -> None:
    tokenizer_dir = ""  # the embedded default (Qwen3)
    gsp = matrix._peer_workload(matrix.MatrixConfig(), _args(*TINY), tokenizer_dir)
    assert gsp.name == "gsp-text" and len(gsp) == 12
    assert all(s.endpoint == "completions" and s.prompt and s.prompt_token_ids is None for s in gsp)
    args = _args("--peer-workload", "chat", *TINY)
    chat = matrix._peer_workload(matrix.MatrixConfig(peer_workload="chat"), args, tokenizer_dir)
    assert chat.name == "chat-peers" and len(chat) == 4
    assert all(s.endpoint == "chat" and s.messages for s in chat)
    assert chat.name in matrix.PEER_WORKLOADS
