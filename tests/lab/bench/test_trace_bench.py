"""`token-gateway bench trace` end to end at toy size: a Mooncake trace through two policies
on both fleet builds, each cell a fresh in-process fleet and gateway."""

from __future__ import annotations

import argparse
import json

import pytest

from gateway.cli import build_parser
from gateway_lab.bench import trace_bench


def _args(*argv: str) -> argparse.Namespace:
    return build_parser().parse_args(["bench", "trace", *argv])


def mooncake(path, conversations: int = 6, turns: int = 2):  # type: ignore[no-untyped-def]
    """Every request starts with block 0; each conversation's turns extend its own blocks."""
    lines, next_id = [], 1
    own = {}
    for _ in range(turns):
        for c in range(conversations):
            own.setdefault(c, [])
            own[c] += [next_id, next_id + 1]
            next_id += 2
            ids = [0, *own[c]]
            lines.append({"timestamp": 100 * len(lines), "input_length": 512 * len(ids), "output_length": 128,
                          "hash_ids": ids})
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return path


@pytest.mark.slow  # four cells, each a fresh fleet and gateway
def test_every_policy_runs_on_both_fleets_next_to_the_trace_ideals(tmp_path, capsys) -> None:
    trace = mooncake(tmp_path / "t.jsonl")
    out, md = tmp_path / "t.json", tmp_path / "t.md"
    args = _args("--trace", str(trace), "--policies", "round_robin", "prefix_hash", "--workers", "2",
                 "--time-scale-sim", "0", "--block-tokens", "16", "--time-scale", "0.01",
                 "--json", str(out), "--markdown", str(md))
    assert trace_bench.run(args) == 0
    data = json.loads(out.read_text())
    cells = {(c["fleet"], c["policy"]): c for c in data["cells"]}
    assert set(cells) == {(f, p) for f in trace_bench.FLEETS for p in ("round_robin", "prefix_hash")}
    for cell in cells.values():
        s = cell["summary"]
        assert s["ok"] == 12 and s["errors"] == 0
        assert 0 < cell["ideals"]["fleet_kv"] <= cell["ideals"]["unbounded"] < 1
        assert s["hit_rate"] <= cell["ideals"]["unbounded"] + 1e-9
        misses = cell["sim"]["miss_causes"]  # the gateway's own account of every miss
        assert misses["_requests"] == 12 and misses["first_sight"]["tokens"] > 0
    assert data["fleets"]["sim-alt"]["page_size"] != data["fleets"]["sim"]["page_size"]
    text = md.read_text()
    assert "| fleet | policy | hit |" in text and "within the fleet's" in text and "missed" in text
    assert "sim-alt" in capsys.readouterr().out


@pytest.mark.slow  # one cell: a fresh fleet and gateway
def test_requests_out_joins_each_decision_with_its_worker_timeline(tmp_path, capsys) -> None:
    trace = mooncake(tmp_path / "t.jsonl")
    rows_path = tmp_path / "requests.jsonl"
    rows_path.write_text("stale\n")  # a run starts a fresh file
    args = _args("--trace", str(trace), "--policies", "cache_aware", "--fleets", "sim", "--workers", "2",
                 "--time-scale-sim", "0", "--block-tokens", "16", "--time-scale", "0.01",
                 "--requests-out", str(rows_path))
    assert trace_bench.run(args) == 0
    rows = [json.loads(line) for line in rows_path.read_text().splitlines()]
    assert [r["index"] for r in rows] == list(range(12))
    for r in rows:
        assert r["fleet"] == "sim" and r["policy"] == "cache_aware" and r["ok"]
        assert r["id"] == f"rt-{r['index']}" and r["chosen"] == r["worker"]
        assert set(r["seen"]) == set(r["true"]) == {r["chosen"], *r["seen"]} and len(r["seen"]) == 2
        assert r["reason"] in ("no_match", "cache_hit", "load_balanced", "cache_miss_balanced")
        for phase in ("routed_ms", "to_worker_ms", "wait_ms", "prefill_ms", "back_ms"):
            assert r[phase] >= 0, (phase, r)
        assert r["routed_ms"] + r["to_worker_ms"] + r["wait_ms"] + r["prefill_ms"] + r["back_ms"] == pytest.approx(
            r["ttft_ms"], abs=0.1)
    assert sum(r["cached"] for r in rows) > 0  # the second turns hit
    assert "sim cache_aware: 12 requests; slowest 1" in capsys.readouterr().out


def test_a_missing_trace_is_refused(tmp_path) -> None:
    with pytest.raises(SystemExit, match="--trace"):
        trace_bench.run(_args("--trace", str(tmp_path / "nope.jsonl")))


def test_peer_cells_are_ours_as_a_process_then_each_peer_per_policy() -> None:
    bench = trace_bench.TraceBenchConfig(peers=["smg"], peer_policies=["round_robin", "cache_aware"])
    assert trace_bench.peer_plan(bench) == [
        ("ours-process", "round_robin"), ("smg", "round_robin"), ("ours-process", "cache_aware"), ("smg", "cache_aware"),
    ]  # fmt: skip
    assert trace_bench.peer_plan(trace_bench.TraceBenchConfig()) == []
    knobs = trace_bench.TraceBenchConfig(peers=["smg"], peer_policies=["cache_aware", "cache_aware:stick_queue_tokens=0"])
    assert trace_bench.peer_plan(knobs) == [
        ("ours-process", "cache_aware"), ("smg", "cache_aware"), ("ours-process", "cache_aware:stick_queue_tokens=0"),
    ]  # fmt: skip


def test_the_text_workload_tokenizes_back_to_the_trace_ids(tmp_path) -> None:
    from tokenizers import Tokenizer

    from gateway_lab.bench.traces import TraceConfig, load_trace_workload
    from gateway_lab.bench.workloads import Vocab, default_tokenizer_dir

    vocab = Vocab.from_tokenizer_dir(str(default_tokenizer_dir()))
    workload = load_trace_workload(str(mooncake(tmp_path / "t.jsonl")), TraceConfig(block_tokens=16), vocab)
    text = trace_bench.as_text(workload, vocab)
    assert len(text) == len(workload) and text.name.endswith("(text)")
    tok = Tokenizer.from_file(str(default_tokenizer_dir() / "tokenizer.json"))
    for spec, sent in zip(workload, text, strict=True):
        assert sent.prompt_token_ids is None and sent.arrival_s == spec.arrival_s
        assert tok.encode(sent.prompt, add_special_tokens=False).ids == list(spec.prompt_token_ids)


def test_peers_without_their_virtualenv_are_refused(tmp_path) -> None:
    trace = mooncake(tmp_path / "t.jsonl")
    with pytest.raises(SystemExit, match=r"peers\.sh"):
        trace_bench.run(_args("--trace", str(trace), "--peers", "smg", "--peers-python", str(tmp_path / "none")))
