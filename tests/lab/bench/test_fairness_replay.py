"""bench fairness-replay: the replay's settings, its determinism, and that every request's slots are freed."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest

from gateway_lab.bench.fairness import FairnessConfig, tenant_workload
from gateway_lab.bench.fairness_replay import (
    Replay,
    ReplayModel,
    admission_config,
    fleet_sim,
    replay_cell,
)
from gateway_lab.bench.workloads import Vocab, default_tokenizer_dir
from gateway_lab.sim.virtual_clock import run_virtual
from gateway_lab.sim.vocab import load_vocab

RULE = "1:3:512+gate-share-first+fair-prefill-reserve"


@pytest.fixture(scope="module")
def vocabs() -> tuple[Vocab, Any]:
    path = str(default_tokenizer_dir())
    return Vocab.from_tokenizer_dir(path), load_vocab(path)


def small(**overrides: Any) -> FairnessConfig:
    base: dict[str, Any] = {"fleets": ["sim-alt"], "queues": [RULE], "shares": False, "duration_s": 6.0,
                            "grace_s": 10.0, "groups": 4}  # fmt: skip
    return FairnessConfig(**(base | overrides))


def test_admission_settings_from_a_queue_entry() -> None:
    config = admission_config(RULE, 45.0, ["a=2"])
    assert (config.fleet_headroom, config.fair_reserve, config.prefill_budget_tokens) == (1, 3, 512)
    assert config.gate_share_first and config.fair_prefill_reserve and not config.fair_spill
    assert config.queue_timeout_s == 45.0 and config.key_weights == ["a=2"]
    assert admission_config("off", 1.0, []).fleet_headroom == -1
    with pytest.raises(ValueError, match="replay knows"):
        admission_config("1:3+max-queued-requests", 1.0, [])  # a flag, but not one of admission's switches


def test_a_cell_is_the_same_on_every_run(vocabs: tuple[Vocab, Any]) -> None:
    config = small()
    first = replay_cell(config, "sim-alt", RULE, *vocabs)
    again = replay_cell(config, "sim-alt", RULE, *vocabs)
    assert first == again
    assert first.light_ok == "18/18"
    assert 0 < first.alone_p50 <= first.alone_p99 < math.inf
    assert first.light_p99 >= first.alone_p50
    assert first.heavy_done_per_s > 0 and first.hit_rate is not None and 0 < first.hit_rate < 1


def test_a_lone_key_pays_nothing_for_the_reservation(vocabs: tuple[Vocab, Any]) -> None:
    """A key alone never yields its prefill: the rule's flags leave its figures as they are."""
    config = small(queues=["1:3:512", RULE])
    plain = replay_cell(config, "sim-alt", "1:3:512", *vocabs)
    ruled = replay_cell(config, "sim-alt", RULE, *vocabs)
    assert (plain.alone_p50, plain.alone_p99) == (ruled.alone_p50, ruled.alone_p99)


@pytest.mark.parametrize("queue", ["off", "1:3:512", RULE])
def test_requests_cut_at_the_end_free_every_slot(vocabs: tuple[Vocab, Any], queue: str) -> None:
    """Past the fleet's capacity, with no grace, the run's end cuts requests in the gate, in
    admission and on the workers: each gives back its admission slot, gate pass and load."""
    config = small(duration_s=3.0, grace_s=0.0, queues=[queue])
    vocab, sim_vocab = vocabs
    heavy = tenant_workload(config, vocab, 60.0, seed=2)
    replay = Replay(config, fleet_sim(config, "sim-alt"), admission_config(queue, 30.0, []), sim_vocab)
    results = run_virtual(replay.run({"heavy": heavy}))
    outs = results["heavy"]
    assert 0 < sum(o.ok for o in outs) < len(outs)
    assert replay.admission.in_flight == 0 and replay.admission.queued == 0
    if replay.gate is not None:
        assert all(replay.gate.through(w.id) == 0 and replay.gate.held(w.id) == 0 for w in replay.workers)
    for w in replay.workers:
        assert (w.load.in_flight, w.load.queued_prefill_tokens, w.load.running_decode_tokens) == (0, 0, 0)
        assert w.scheduler.num_running == 0 and w.scheduler.num_waiting == 0
    assert replay.holds is not None and len(replay.holds.rule) == 0  # no request left in prefill
    assert all(st.waiting == 0 for st in replay.holds.stats.values())


def test_the_prefill_gate_and_the_load_poll_as_serve_runs_them(vocabs: tuple[Vocab, Any]) -> None:
    """A lone key's burst: the prefill gate holds a request behind one of its group in
    prefill on the same worker (as serve does by default), and the policy reads the
    workers' polled figures; both can be left out."""
    config = small(duration_s=4.0, grace_s=10.0, groups=2)
    vocab, sim_vocab = vocabs
    light = tenant_workload(config, vocab, 6.0, seed=1)

    def run(model: ReplayModel) -> tuple[Replay, list[Any]]:
        replay = Replay(config, fleet_sim(config, "sim-alt"), admission_config(RULE, 30.0, []), sim_vocab, model)
        return replay, run_virtual(replay.run({"light": light}))["light"]

    modelled, outs = run(ReplayModel())
    assert all(o.ok for o in outs)
    assert modelled.holds is not None and sum(st.held for st in modelled.holds.stats.values()) > 0
    assert all(w.polled is not None for w in modelled.workers)
    assert all(w.view(w.polled_at + 0.25).loads.age_s == 0.25 for w in modelled.workers)  # type: ignore[union-attr]
    bare, bare_outs = run(ReplayModel(replay_prefill_gate=False, replay_load_poll_s=0.0))
    assert bare.holds is None and all(w.polled is None and w.view().loads is None for w in bare.workers)
    assert all(o.ok for o in bare_outs)
    with pytest.raises(ValueError, match="replay-load-poll-s"):
        ReplayModel(replay_load_poll_s=-1.0)


def test_requests_out_rows_carry_each_requests_worker_and_waits(vocabs: tuple[Vocab, Any], tmp_path: Any) -> None:
    path = tmp_path / "rows.jsonl"
    config = small(requests_out=str(path))
    cell = replay_cell(config, "sim-alt", RULE, *vocabs, seed=5)
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    light = [r for r in rows if r["run"] == "together" and r["key"] == "light"]
    assert cell.seed == 5 and {r["seed"] for r in rows} == {5}
    assert {r["run"] for r in rows} == {"alone", "together"}
    assert len(light) == 18 and [r["index"] for r in light] == list(range(18))
    assert all(r["worker"] in range(4) and r["ok"] and r["admission_s"] >= 0 and r["gate_s"] >= 0 for r in light)
    assert max(r["ttft_s"] for r in light) == pytest.approx(cell.light_p99, abs=1e-6)
    other = replay_cell(small(), "sim-alt", RULE, *vocabs, seed=6)
    assert (other.alone_p50, other.alone_p99) != (cell.alone_p50, cell.alone_p99)  # another seed: other requests


def test_the_gateways_own_time_is_a_seeded_delay_counted_in_ttft(vocabs: tuple[Vocab, Any]) -> None:
    config = small(duration_s=4.0, groups=2)
    vocab, sim_vocab = vocabs
    light = tenant_workload(config, vocab, 3.0, seed=1)

    def ttfts(gateway_ms: float, seed: int = 1) -> list[float]:
        replay = Replay(config, fleet_sim(config, "sim-alt"), admission_config(RULE, 30.0, []), sim_vocab,
                        ReplayModel(replay_gateway_ms=gateway_ms))  # fmt: skip
        return [o.ttft_s or math.inf for o in run_virtual(replay.run({"light": light}, jitter_seed=seed))["light"]]

    plain, slowed = ttfts(0.0), ttfts(20.0)
    assert slowed == ttfts(20.0) and slowed != ttfts(20.0, seed=2)  # the draw is the seed's
    assert sum(slowed) > sum(plain) and max(s - p for s, p in zip(slowed, plain, strict=True)) <= 0.5
    with pytest.raises(ValueError, match="replay-gateway-ms"):
        ReplayModel(replay_gateway_ms=-1.0)
