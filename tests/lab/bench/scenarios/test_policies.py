"""End-to-end check of the policies against the independent simulated caches in
`token-gateway bench policies` (gateway_lab.bench.scenarios.policies) (small sizes; no timing is asserted)."""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
from pathlib import Path
from types import ModuleType

import pytest

from gateway.policies import PolicyConfig, close_policy, make_policy
from gateway.policies.base import RouteRequest, WorkerView


def views(n: int) -> list[WorkerView]:
    return [WorkerView(f"w{i}", f"sim://w{i}", kv_capacity_tokens=1 << 16, page_size=16) for i in range(n)]


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    from gateway_lab.bench.scenarios import policies

    return policies


def run(bench: ModuleType, name: str, hot_share: float = 0.0, **overrides: object):  # type: ignore[no-untyped-def]
    wl = bench.gsp_workload(16, 8, 512, 32, 32, seed=3, hot_share=hot_share)
    policy = make_policy(PolicyConfig(policy=name, eviction_interval_s=0), **overrides)
    try:
        return wl, bench.simulate(policy, wl, 4, 4096, 16, 16, bench.Timing(), 0.0, {})[0]
    finally:
        close_policy(policy)


def test_cache_aware_approaches_the_ideal_hit_rate_and_beats_cache_blind_routing(bench: ModuleType) -> None:
    wl, ca = run(bench, "cache_aware")
    _, rr = run(bench, "round_robin")
    assert ca.hit_rate > 0.85 * wl.ideal_hit
    assert ca.hit_rate > rr.hit_rate + 0.2
    assert ca.throughput_tok_s > rr.throughput_tok_s
    # the tree's predictions track what the independent caches really held
    assert abs(ca.predicted_hit - ca.hit_rate) < 0.1


def test_hot_prefix_stays_balanced_with_cache_aware_but_not_with_sticky_hashing(bench: ModuleType) -> None:
    _, ca = run(bench, "cache_aware", hot_share=0.5)
    _, ch = run(bench, "consistent_hash", hot_share=0.5)
    assert ca.served_max_over_mean < 1.5
    assert ch.served_max_over_mean > ca.served_max_over_mean


def test_the_prefill_gate_removes_in_batch_duplicates_in_a_burst(bench: ModuleType) -> None:
    from gateway.pipeline.prefill_gate import PrefillGateConfig

    # 2K-token system prompts, the matrix's step costs: 4 x 16 running slots, 256 at once
    wl = bench.gsp_workload(16, 16, 2048, 128, 64, seed=3)
    timing = bench.Timing(base_s=0.01, prefill_s_per_token=1e-4, decode_s_per_req=1e-3, max_running=16)
    out = {}
    for gate in (None, PrefillGateConfig()):
        policy = make_policy(PolicyConfig(policy="cache_aware", eviction_interval_s=0))
        try:
            out[gate is not None] = bench.simulate(policy, wl, 4, 40960, 16, len(wl.prompts), timing, 0.0, {},
                                                   True, 0.0, gate, True)[0]
        finally:
            close_policy(policy)
    off, on = out[False], out[True]
    assert off.misses.duplicate > 0 and off.held == 0  # FCFS admits a group's requests together
    assert on.held > 0 and on.timed_out == 0
    assert on.misses.duplicate < off.misses.duplicate and on.hit_rate > off.hit_rate
    # every missed token has exactly one cause
    m = on.misses
    assert m.unique + m.first + m.evicted + m.duplicate == round((1 - on.hit_rate) * sum(map(len, wl.prompts)))


def test_multi_turn_chat_reaches_its_ideal_and_resent_text_lowers_it(bench: ModuleType) -> None:
    ids = bench.chat_workload(4, 3, 64, 16, 16, seed=1, page=16)
    text = bench.chat_workload(4, 3, 64, 16, 16, seed=1, page=16, roundtrip=True)
    assert ids.follows and len(ids.prompts) == 12 and text.ideal_hit < ids.ideal_hit
    for wl in (ids, text):
        policy = make_policy(PolicyConfig(policy="cache_aware", eviction_interval_s=0))
        try:
            r = bench.simulate(policy, wl, 2, 1 << 16, 16, 4, bench.Timing(), 0.0, {}, True)[0]
        finally:
            close_policy(policy)
        assert r.hit_rate == pytest.approx(wl.ideal_hit, abs=1e-9)  # nothing moves, nothing is evicted
        assert r.misses.first == r.misses.evicted == r.misses.duplicate == 0


def test_the_queued_prefill_weight_spills_uniform_prefixes_less_and_leaves_a_hot_one_alone(bench: ModuleType) -> None:
    """Against the independent caches: on uniform shared prefixes the adaptive weight (the spread weight
    while no prefix is hot) recomputes fewer prefixes elsewhere than a fixed 1.0; with one
    prefix carrying half the traffic it is the fixed 1.0 once that prefix reads as hot: the
    few decisions before take the spread weight, and the pool stays balanced."""
    timing = bench.Timing(base_s=0.01, prefill_s_per_token=1e-4, decode_s_per_req=1e-3, max_running=16)
    out = {}
    for hot_share in (0.0, 0.5):
        wl = bench.gsp_workload(32, 16, 2048, 128, 64, seed=3, hot_share=hot_share)
        for label, knobs in (("adaptive", {}), ("fixed", {"spread_prefill_weight": 1.0})):
            policy = make_policy(PolicyConfig(policy="cache_aware", eviction_interval_s=0), **knobs)
            try:
                out[hot_share, label] = bench.simulate(policy, wl, 4, 40960, 16, len(wl.prompts), timing, 0.1, {},
                                                       True)[0]
            finally:
                close_policy(policy)
    uniform, fixed = out[0.0, "adaptive"], out[0.0, "fixed"]
    assert uniform.misses.first < fixed.misses.first  # fewer spills: prefixes first computed on a second worker
    assert uniform.hit_rate >= fixed.hit_rate and uniform.served_max_over_mean < 1.25
    hot, hot_fixed = out[0.5, "adaptive"], out[0.5, "fixed"]
    assert hot.hit_rate >= hot_fixed.hit_rate and hot.served_max_over_mean < 1.25
    assert hot.ttft_p99_ms <= hot_fixed.ttft_p99_ms


def test_the_simulation_counts_holders_per_group_and_the_reference_placements(bench: ModuleType) -> None:
    """8 groups on 16 workers at once: SMG's rule keeps each group on one worker, the
    hand placement on two, and the row reports both (requests per worker, holders)."""
    wl = bench.gsp_workload(8, 16, 512, 32, 16, seed=3)
    out = {}
    for name in ("smg_like", "placed_k2", "cache_aware"):
        policy = bench.build_sim_policy({"policy": name, "eviction_interval_s": 0.0})
        try:
            out[name] = bench.simulate(policy, wl, 16, 8192, 16, 128, bench.Timing(max_running=16), 0.0, {})[0]
        finally:
            close_policy(policy)
    assert out["smg_like"].holders == [1] * 8
    assert out["placed_k2"].holders == [2] * 8 and out["placed_k2"].served == [8] * 16
    assert bench.placement(out["placed_k2"]) == "8-8; 2.00 (2); new 8 + blind 0"
    assert out["smg_like"].hit_rate > out["placed_k2"].hit_rate
    ca = out["cache_aware"]
    assert sum(ca.served) == 128 and len(ca.holders) == 8
    # no headroom replicas when every prefix is hot: 22 holders here, 27 with them
    assert sum(ca.holders) <= 23, ca.holders


def test_synced_replicas_in_the_simulation_hear_each_other_and_leave_no_load_behind(bench: ModuleType) -> None:
    """Two cache_aware replicas in front of the same workers (``--replicas 2``): each routes
    its own half of the prompts in its own closed loop, and hears the other's decisions and
    load at the next sync tick. Hearing each other keeps a group on its holders: two
    replicas that do not (their ``on_remote`` ignored) each place every group on a worker
    of their own choosing. Every request is served and every per-replica load figure
    returns to zero."""
    wl = bench.gsp_workload(16, 8, 512, 32, 32, seed=3)

    def pair(deaf: bool) -> tuple[object, list[object]]:
        ps = [make_policy(PolicyConfig(policy="cache_aware", eviction_interval_s=0)) for _ in range(2)]
        if deaf:
            for p in ps:
                p.on_remote = lambda event: None  # type: ignore[method-assign]
        try:
            r = bench.simulate(ps[0], wl, 4, 4096, 16, 16, bench.Timing(), 0.0, {}, replicas=ps[1:], sync_lag_s=0.01)[0]
        finally:
            close_policy(ps[0])
        return r, ps

    synced, ps = pair(False)
    deaf, _ = pair(True)
    assert sum(synced.served) == sum(deaf.served) == len(wl.prompts)
    assert synced.hit_rate > deaf.hit_rate + 0.05, (synced.hit_rate, deaf.hit_rate)
    assert sum(synced.holders) < sum(deaf.holders)
    assert synced.new_holders[1] < deaf.new_holders[1]  # fewer blind placements of a placed group
    assert ps[0].hot._tick > 0 and ps[1].hot._tick > 0


def test_one_replica_is_the_plain_simulation(bench: ModuleType) -> None:
    """``replicas=()`` is the single gateway: identical results to a run without the argument."""
    wl = bench.gsp_workload(8, 8, 256, 32, 16, seed=5)
    out = []
    for extra in ({}, {"replicas": (), "sync_lag_s": 0.5}):
        policy = make_policy(PolicyConfig(policy="cache_aware", eviction_interval_s=0))
        try:
            r = bench.simulate(policy, wl, 4, 2048, 16, 16, bench.Timing(), 0.0, {}, **extra)[0]
        finally:
            close_policy(policy)
        out.append((r.hit_rate, r.served, r.ttft_of))
    assert out[0] == out[1]


def test_spread_outputs_decode_their_own_lengths(bench: ModuleType) -> None:
    """``--output-spread``: each request decodes its own length, seeded, around the same mean,
    with the same prompts; the simulated throughput counts each request's own output."""
    timing = bench.Timing(base_s=0.01, prefill_s_per_token=1e-4, decode_s_per_req=1e-3, max_running=4)
    fixed = bench.gsp_workload(8, 12, 512, 32, 48, seed=2, zipf=1.1)
    spread = bench.spread_outputs(bench.gsp_workload(8, 12, 512, 32, 48, seed=2, zipf=1.1), "uniform", 2)
    again = bench.spread_outputs(bench.gsp_workload(8, 12, 512, 32, 48, seed=2, zipf=1.1), "uniform", 2)
    assert spread.outputs == again.outputs and len(spread.outputs) == len(spread.prompts)
    assert len(set(spread.outputs)) > 10 and "uniform" in spread.name
    assert bench.spread_outputs(fixed, "fixed", 2).outputs == [] and fixed.output_of(3) == 48
    assert spread.prompts == fixed.prompts
    out = {}
    for wl in (fixed, spread):
        policy = make_policy(PolicyConfig(policy="cache_aware", eviction_interval_s=0))
        try:
            r = bench.simulate(policy, wl, 4, 8192, 16, 16, timing, 0.0, {}, reserve_running=True,
                               cache_output=True)[0]
        finally:
            close_policy(policy)
        out[wl is spread] = r
    # the simulated throughput counts each request's own output
    total = sum(spread.outputs)
    assert out[True].throughput_tok_s == pytest.approx(total / out[True].makespan_s)
    assert out[False].throughput_tok_s == pytest.approx(len(fixed.prompts) * 48 / out[False].makespan_s)
    assert out[True].hit_rate > 0.6 and out[False].hit_rate > 0.6


def test_slowest_row_names_who_the_slowest_percent_are(bench: ModuleType) -> None:
    """``--slowest``: the slowest 1% of TTFT, with each one's decision reason, whether its prefix
    was hot and whether its worker was full at the decision while another had a free slot."""
    timing = bench.Timing(base_s=0.01, prefill_s_per_token=1e-4, decode_s_per_req=1e-3, max_running=2)
    wl = bench.gsp_workload(8, 40, 256, 32, 24, seed=1, zipf=1.1)
    policy = make_policy(PolicyConfig(policy="cache_aware", eviction_interval_s=0))
    try:
        r = bench.simulate(policy, wl, 4, 4096, 16, 8, timing, 0.0, {}, reserve_running=True)[0]
    finally:
        close_policy(policy)
    counted = len(r.ttft_of)
    assert counted == len(wl.prompts) - 8  # the closed loop leaves out its first 8
    assert set(r.decided) == set(range(len(wl.prompts))) and set(r.slot_wait) == set(r.ttft_of)
    assert all(0 <= r.slot_wait[i] <= r.ttft_of[i] + 1e-9 for i in r.ttft_of)
    row = bench.slowest_row("cache_aware", r, wl, 4, timing.max_running)
    assert len(row) == len(bench.SLOWEST_HEADERS)
    n = counted // 100
    assert row[1].startswith(f"{n} (")
    assert 0 <= int(row[2]) <= n and 0 <= int(row[3]) <= n and 0 <= int(row[6]) <= n
    assert sum(int(part.rsplit(" ", 1)[1]) for part in row[4].split(", ")) == n
    # the slowest waited at least as long as the median request
    assert float(row[5].split(" / ")[1]) >= sorted(r.ttft_of.values())[counted // 2]
    assert row[7].endswith(f"of {counted}")


def test_an_open_loop_trace_arrives_on_its_own_times(bench: ModuleType, tmp_path: object) -> None:
    """A trace replays open loop: each request at its arrival time, whatever is in flight (a
    closed loop of 1 would send the second only after the first ended), every one counted."""
    import orjson

    trace = tmp_path / "t.jsonl"  # type: ignore[operator]
    lines = [{"timestamp": 1000 * t, "input_length": 1024, "output_length": 512, "hash_ids": [1, 2 + i]}
             for i, t in enumerate((0, 0, 4, 4))]
    trace.write_bytes(b"\n".join(orjson.dumps(x) for x in lines))
    wl = bench.trace_workload(str(trace), 0, 0.5, 16)
    assert wl.arrivals == [0.0, 0.0, 2.0, 2.0] and wl.outputs == [32] * 4
    assert len(wl.prompts[0]) == 64 and wl.prompts[0][:32] == wl.prompts[3][:32]
    policy = bench.build_sim_policy({"policy": "round_robin"})
    r = bench.simulate(policy, wl, 2, 4096, 16, 1, bench.Timing(), 0.0, {})[0]
    assert len(r.ttft_of) == 4 and r.makespan_s > 2.0
    assert max(r.ttft_of.values()) < 0.1  # nobody waited for another's end


def test_micro_writes_its_tables_as_json_and_markdown(
    bench: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> None:
    # the decision-time table builds multi-million-token trees: a small one stands in for it here
    small = bench.Table.of("decision time", ["policy / request", "p50 µs"], [["cache_aware hit", "12"]], labels=1)
    monkeypatch.setattr(bench, "bench_decisions", lambda n_requests, tree_tokens: small)
    parser = argparse.ArgumentParser()
    bench.add_arguments(parser)
    out_json, out_md = tmp_path / "micro.json", tmp_path / "micro.md"
    args = parser.parse_args(["micro", "--tree-tokens", "10000", "--json", str(out_json), "--markdown", str(out_md)])
    assert bench.main(args) == 0
    assert "machine:" in capsys.readouterr().out
    report = json.loads(out_json.read_text())
    assert list(report["rows"]) == ["decision time", "tree memory (tracemalloc)", "eviction (per-worker budgets halved, LRU leaves first)"]
    assert report["rows"]["decision time"] == [{"policy / request": "cache_aware hit", "p50 µs": "12"}]
    assert report["args"]["tree_tokens"] == 10_000 and "load_avg_end" in report["machine"]
    memory, eviction = report["rows"]["tree memory (tracemalloc)"], report["rows"]["eviction (per-worker budgets halved, LRU leaves first)"]
    assert len(memory) == 3 and all(float(row["bytes per token"]) > 0 for row in memory)
    assert [row["workers"] for row in eviction] == ["8", "256"] and all(int(row["nodes evicted"]) > 0 for row in eviction)
    assert "#### tree memory (tracemalloc)" in out_md.read_text()


def test_sim_and_tune_write_a_table_per_workload(bench: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    parser = argparse.ArgumentParser()
    bench.add_arguments(parser)
    out_json = tmp_path / "sim.json"
    small = ["--groups", "2", "--prompts", "2", "--system", "64", "--question", "16", "--output", "4", "--workers", "2",
             "--capacity", "1024", "--concurrency", "2", "--workload", "gsp", "hot", "--zipf", "0", "--prefill-gate", "off"]
    args = parser.parse_args(["sim", *small, "--only", "round_robin", "--slowest", "--json", str(out_json)])
    assert bench.main(args) == 0
    rows = json.loads(out_json.read_text())["rows"]
    titles = list(rows)
    assert [t.split(":")[0] for t in titles] == ["simulation", "slowest 1% of TTFT", "simulation", "slowest 1% of TTFT"]
    assert all(row["policy"] == "round_robin" for row in rows[titles[0]]) and rows[titles[0]][0]["hit rate"].endswith("%")
    args = parser.parse_args(["tune", *small[:-6], "--workload", "gsp", "--json", str(out_json)])
    assert bench.main(args) == 0
    grid = json.loads(out_json.read_text())["rows"]  # one table: its rows, not keyed by title
    assert len(grid) > 20 and {row["policy"].split()[0] for row in grid} == {"additive", "multiplicative", "prefix_hash"}
    assert "tuning: " in capsys.readouterr().out


def test_decision_records_add_up_to_the_hit_rate_and_show_who_left_the_best_holder(bench: ModuleType) -> None:
    wl = bench.gsp_workload(16, 8, 512, 32, 32, seed=3)
    out = {}
    for name in ("cache_aware", "round_robin"):
        policy = make_policy(PolicyConfig(policy=name, eviction_interval_s=0))
        log: list[dict[str, object]] = []
        try:
            r = bench.simulate(policy, wl, 4, 4096, 16, 16, bench.Timing(), 0.0, {}, decisions=log)[0]
        finally:
            close_policy(policy)
        assert sorted(rec["request"] for rec in log) == list(range(len(wl.prompts)))
        assert sum(rec["cached"] for rec in log) / sum(rec["prompt"] for rec in log) == pytest.approx(r.hit_rate)
        assert all(set(rec["held"]) == set(rec["in_flight"]) == {"w0", "w1", "w2", "w3"} for rec in log)
        out[name] = log
    away = [rec for rec in out["round_robin"] if rec["held"][rec["worker"]] < max(rec["held"].values())]
    assert away and all(rec["reason"] == "round_robin" for rec in away)
    summary = bench.decision_summary(out["round_robin"])
    assert "away from the best holder: round_robin" in summary
    assert bench.decision_summary(out["cache_aware"]).startswith("best holder held ")


def test_the_sim_section_writes_decisions_as_json_lines(bench: ModuleType, tmp_path: Path, capsys) -> None:
    parser = argparse.ArgumentParser()
    bench.add_arguments(parser)
    path = tmp_path / "decisions.jsonl"
    args = parser.parse_args(["sim", "--workload", "gsp", "--groups", "4", "--prompts", "4", "--system", "64",
                              "--question", "16", "--output", "4", "--workers", "2", "--concurrency", "4",
                              "--zipf", "0", "--prefill-gate", "off", "--variant", "round_robin",
                              "--decisions", str(path)])
    bench.run_sim(args)
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert len(lines) == 16 and {rec["policy"] for rec in lines} == {"round_robin"}
    assert "[decisions] round_robin: best holder held" in capsys.readouterr().out


def test_smg_events_follows_the_true_caches_and_the_tree_emulation_sends_short_matches_to_the_least_loaded(
    bench: ModuleType,
) -> None:
    """SMG with KV events routes on the workers' true caches: it keeps every gsp group on one
    worker from the start, and never predicts a hit the caches do not hold; without events a
    prompt whose match is under the threshold goes to the least loaded worker, or with
    ``smallest_tree`` to the emptiest tree."""
    wl = bench.gsp_workload(8, 8, 512, 32, 16, seed=5)
    events = bench.build_sim_policy({"policy": "smg_events"})
    log: list[dict[str, object]] = []
    r = bench.simulate(events, wl, 4, 1 << 16, 16, 4, bench.Timing(), 0.0, {}, decisions=log)[0]
    assert r.hit_rate > 0.8 * wl.ideal_hit
    assert all(rec["predicted"] == rec["held"][rec["worker"]] for rec in log)
    with pytest.raises(RuntimeError, match="bind_true_caches"):
        bench.SmgLikePolicy(events=True).select(RouteRequest([1] * 32), views(2))
    for smallest, expected in ((False, "w0"), (True, "w1")):
        p = bench.SmgLikePolicy(smallest_tree=smallest)
        ws = views(2)
        first = p.select(RouteRequest([9] * 64), [replace(ws[0], in_flight=0), replace(ws[1], in_flight=5)])
        assert first.worker_id == "w0"  # the least loaded, and both trees empty: w0's tree grows
        d = p.select(RouteRequest([7] * 64), [replace(ws[0], in_flight=1), replace(ws[1], in_flight=3)])
        assert (d.worker_id, d.reason) == (expected, "no_match")


def test_learn_output_gives_the_tree_what_the_gateway_learns(bench: ModuleType) -> None:
    """``--learn-output``: each finished request's output ids reach the policy's ``on_output``,
    so its tree holds prompt + output in whole pages as the gateway's does (single-turn: ids no
    prompt holds, each request its own); without it the tree holds the prompts only. A
    multi-turn workload's next turn then matches the reply it resends on the worker that made it."""
    timing = bench.Timing(base_s=0.01, prefill_s_per_token=1e-4, decode_s_per_req=1e-3, max_running=4)
    wl = bench.gsp_workload(4, 6, 256, 32, 48, seed=3, zipf=0.0)
    held = {}
    for learn in (False, True):
        policy = make_policy(PolicyConfig(policy="cache_aware", eviction_interval_s=0))
        try:
            bench.simulate(policy, wl, 2, 1 << 16, 16, 4, timing, 0.0, {}, reserve_running=True,
                           cache_output=True, learn_output=learn)
            held[learn] = sum(t.worker_tokens(w) for t in policy.trees() for w in t.workers())
        finally:
            close_policy(policy)
    # every request's 48 output ids (3 whole pages of 16) on top of the prompts
    assert held[True] - held[False] == len(wl.prompts) * 48, held

    chat = bench.chat_workload(6, 3, 64, 24, 16, 1, 16, False)
    hits = {}
    for learn in (False, True):
        policy = make_policy(PolicyConfig(policy="cache_aware", eviction_interval_s=0))
        try:
            r = bench.simulate(policy, chat, 2, 1 << 16, 16, 4, timing, 0.0, {}, reserve_running=True,
                               cache_output=True, learn_output=learn)[0]
        finally:
            close_policy(policy)
        hits[learn] = (r.predicted_hit, r.hit_rate)
    # told only lengths, the tree misses the resent replies the workers hold; told the ids,
    # it predicts exactly what the workers hit
    assert hits[False][0] < hits[False][1]
    assert hits[True][0] == pytest.approx(hits[True][1])
