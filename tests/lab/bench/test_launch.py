"""The one launcher (gateway_lab/bench/launch.py): a fleet of each kind is up inside its
block and gone after it, our gateway and a peer are stopped and their logs removed however
the block ends, and a variant's knobs land in our gateway's settings."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path
from typing import Any

import pytest

from gateway.cli import build_parser
from gateway_lab.bench import launch
from gateway_lab.sim.config import SimConfig

CHILD = str(Path(__file__).with_name("ready_child.py"))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except (ProcessLookupError, OSError):
        return False


async def test_our_gateway_is_stopped_and_its_log_removed(tmp_path: Path) -> None:
    async with launch.gateway("ours", [], "round_robin", argv=[sys.executable, CHILD, "ok"], log_dir=tmp_path) as gw:
        assert gw.kind == "ours" and gw.url.startswith("http://127.0.0.1:") and _alive(gw.pid)
        assert gw.log_path.exists() and "grandchild" in gw.ready_info
    assert not _alive(gw.pid) and not gw.log_path.exists()


async def test_the_gateway_stops_when_the_block_raises_and_keeps_its_log(tmp_path: Path) -> None:
    with pytest.raises(KeyError):
        async with launch.gateway("ours", [], "rr", argv=[sys.executable, CHILD, "ok"], log_dir=tmp_path) as gw:
            raise KeyError("the run failed")
    assert not _alive(gw.pid) and gw.log_path.exists()
    async with launch.gateway(
        "ours", [], "rr", argv=[sys.executable, CHILD, "ok"], log_dir=tmp_path, keep_log=True
    ) as kept:
        pass
    assert not _alive(kept.pid) and kept.log_path.exists()


async def test_a_gateway_that_cannot_start_says_why(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match="no workers"):
        async with launch.gateway("ours", [], "x", argv=[sys.executable, CHILD, "exit"], log_dir=tmp_path):
            pass
    with pytest.raises(ValueError, match="unknown gateway 'nginx'"):
        async with launch.gateway("nginx", [], "round_robin"):
            pass


async def test_a_gateway_that_dies_during_the_run_makes_it_fail_and_keeps_its_log(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match=r"(?s)ours gateway exited during the run \(code 4\).*dying now"):
        async with launch.gateway("ours", [], "rr", argv=[sys.executable, CHILD, "die"], log_dir=tmp_path) as gw:
            for _ in range(200):  # it exits once it has answered its readiness probe
                if not _alive(gw.pid):
                    break
                await asyncio.sleep(0.05)
            await asyncio.sleep(0.5)  # the event loop's child watcher records the exit
    assert not _alive(gw.pid) and gw.log_path.exists()


class _FakePeer:
    started: list[tuple[Any, ...]] = []

    def __init__(self) -> None:
        self.url, self.log_path, self.stopped, self.removed = "http://peer", Path("peer.log"), False, False
        self.process = type("P", (), {"pid": 4242, "returncode": None})()

    @classmethod
    async def start(cls, *args: Any, **kwargs: Any) -> _FakePeer:
        cls.started.append(args)
        cls.last = cls()
        return cls.last

    async def stop(self, timeout_s: float = 5.0) -> int:
        self.stopped = timeout_s
        return 0

    def remove_log(self) -> None:
        self.removed = True


async def test_smg_starts_through_the_peer_launcher_with_our_tokenizer(monkeypatch: pytest.MonkeyPatch) -> None:
    from gateway_lab.bench import peers

    monkeypatch.setattr(peers, "PeerProcess", _FakePeer)
    async with launch.gateway(
        "smg", ["grpc://w:1"], "cache_aware", peers_python="py", tokenizer_dir="/tok", stop_timeout_s=20
    ) as gw:
        assert (gw.kind, gw.url, gw.pid) == ("smg", "http://peer", 4242)
    assert _FakePeer.started[-1] == ("py", "smg", ["grpc://w:1"], "cache_aware", "/tok")
    assert _FakePeer.last.stopped == 20 and _FakePeer.last.removed


async def test_an_in_process_fleet_serves_inside_its_block() -> None:
    async with launch.fleet("sim", 2, launch.ZERO_COST) as fleet:
        assert len(fleet.urls) == 2 and all(u.startswith("grpc://127.0.0.1:") for u in fleet.urls)
        assert not any(w.stopping for w in fleet.workers)
    assert all(w.stopping for w in fleet.workers)


async def test_an_http_fleet_speaks_sglangs_api_inside_its_block() -> None:
    import httpx

    async with launch.fleet("http", 2, launch.ZERO_COST, api="sglang") as fleet:
        assert len(fleet.urls) == 2
        async with httpx.AsyncClient(trust_env=False) as client:
            assert (await client.get(fleet.urls[0] + "/health")).status_code == 200
    async with httpx.AsyncClient(trust_env=False) as client:
        with pytest.raises(httpx.HTTPError):
            await client.get(fleet.urls[0] + "/health")


class _FakeChild:
    made: list[_FakeChild] = []

    def __init__(self, n: int, sim: SimConfig | None, **options: Any) -> None:
        self.n, self.sim, self.options, self.entered, self.exited, self.killed = n, sim, options, False, False, False
        _FakeChild.made.append(self)

    async def __aenter__(self) -> _FakeChild:
        self.entered = True
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.exited = True

    def kill(self) -> None:
        self.killed = True


async def test_a_child_process_fleet_is_stopped_then_killed(monkeypatch: pytest.MonkeyPatch) -> None:
    from gateway_lab.sim import fleet as sim_fleet

    monkeypatch.setattr(sim_fleet, "SubprocessFleet", _FakeChild)
    with pytest.raises(RuntimeError):
        async with launch.fleet("process", 3, launch.ZERO_COST, roles=["prefill"] * 3) as child:
            assert child.entered and child.options == {"roles": ["prefill"] * 3}
            raise RuntimeError("the run failed")
    assert child.exited and child.killed and child.n == 3


class _FakeProcesses(_FakeChild):
    def __init__(self, configs: list[SimConfig], **options: Any) -> None:
        super().__init__(len(configs), None, **options)
        self.configs = configs

    def kill_all(self) -> None:
        self.killed = True


async def test_one_process_per_worker_with_faults_for_some(monkeypatch: pytest.MonkeyPatch) -> None:
    from gateway_lab.sim import fleet as sim_fleet

    monkeypatch.setattr(sim_fleet, "WorkerProcesses", _FakeProcesses)
    faults = {0: {"fault_fail_after_tokens": 4, "fault_fail_share": 0.5}}
    async with launch.fleet("processes", 3, launch.ZERO_COST, faults=faults, extra_args=["--engine", "vllm"]) as procs:
        assert procs.entered and procs.options == {"extra_args": ["--engine", "vllm"]}
        assert [c.fault_fail_after_tokens for c in procs.configs] == [4, -1, -1] and procs.configs[0].fault_fail_share == 0.5
        assert procs.configs[1] == launch.ZERO_COST
    assert procs.exited and procs.killed
    with pytest.raises(ValueError, match=r"faults for workers \[5\], of 3"):
        async with launch.fleet("processes", 3, faults={5: {}}):
            pass


async def test_a_canned_fleet_takes_its_own_options(monkeypatch: pytest.MonkeyPatch) -> None:
    from gateway_lab.bench import canned_fleet

    made: list[Any] = []

    class Canned:
        def __init__(self, n: int, **options: Any) -> None:
            self.n, self.options, self.running = n, options, False
            made.append(self)

        def start(self) -> Canned:
            self.running = True
            return self

        def stop(self) -> None:
            self.running = False

    monkeypatch.setattr(canned_fleet, "CannedFleet", Canned)
    async with launch.fleet("canned", 2, output_tokens=8) as canned:
        assert canned.running and (canned.n, canned.options) == (2, {"output_tokens": 8})
    assert not made[0].running
    with pytest.raises(ValueError, match="no simulator settings"):
        async with launch.fleet("canned", 2, launch.ZERO_COST):
            pass


async def test_bad_fleets_are_refused() -> None:
    with pytest.raises(ValueError, match="unknown fleet kind 'gpu'"):
        launch.fleet("gpu", 1)  # type: ignore[call-overload]
    with pytest.raises(ValueError, match="at least one worker"):
        launch.fleet("sim", 0)


def test_a_variant_becomes_our_settings() -> None:
    config = launch.ours_config(
        ["grpc://a:1"], "cache_aware:prefill_gate=off,reply_token_reuse=off", "/tok", "/scratch", seed=7
    )
    assert config.server.worker_urls == ["grpc://a:1"] and config.server.tokenizer_cache_dir == "/scratch"
    assert config.policy.policy == "cache_aware" and config.policy.seed == 7
    assert config.dispatch.prefill_gate is False and config.server.reply_token_reuse is False
    plain = launch.ours_config(["grpc://a:1"], "round_robin", "", "")
    assert plain.policy.policy == "round_robin" and plain.server.reply_token_reuse is True
    assert plain.server.worker_dp_size == 0  # DP ranks as the workers report them
    hidden = launch.ours_config(["grpc://a:1"], "cache_aware:worker_dp_size=1", "", "")
    assert hidden.server.worker_dp_size == 1 and hidden.policy.policy == "cache_aware"
    assert plain.engine.encoder_at_load is True
    lazy = launch.ours_config(["grpc://a:1"], "cache_aware:encoder_at_load=off", "", "")
    assert lazy.engine.encoder_at_load is False and lazy.policy.policy == "cache_aware"
    assert launch.knob_flags(launch.parse_variant("cache_aware:encoder_at_load=off")[1]) == ["--no-encoder-at-load"]
    assert plain.server.kv_events is False
    events = launch.ours_config(["grpc://a:1"], "cache_aware:kv_events=on", "", "")
    assert events.server.kv_events is True and events.policy.policy == "cache_aware"
    assert launch.knob_flags(launch.parse_variant("cache_aware:kv_events=on")[1]) == ["--kv-events"]
    paced = launch.ours_config(["grpc://a:1"], "cache_aware:fleet_headroom=1,prefill_budget_tokens=1024", "", "")
    assert (paced.admission.fleet_headroom, paced.admission.prefill_budget_tokens) == (1, 1024)
    assert paced.policy.policy == "cache_aware" and plain.admission.fleet_headroom == -1
    serve = build_parser().parse_args(["serve", *launch.knob_flags(launch.parse_variant("x:fair_reserve=1")[1])])
    assert serve.fair_reserve == 1
    first = build_parser().parse_args(["serve", *launch.knob_flags(launch.parse_variant("x:gate_share_first=on")[1])])
    assert first.gate_share_first is True
    spill = build_parser().parse_args(["serve", *launch.knob_flags(launch.parse_variant("x:fair_spill=on")[1])])
    assert spill.fair_spill is True
    with pytest.raises(ValueError, match="not knob=value"):
        launch.ours_config([], "cache_aware:nope=1", "", "")

def test_variants_take_policy_and_prefill_gate_knobs_and_become_serve_flags() -> None:
    name, knobs = launch.parse_variant("cache_aware:prefill_weight=0.5,prefill_gate=off,prefill-gate-min-tokens=256")
    assert name == "cache_aware" and knobs == {"prefill_weight": 0.5, "prefill_gate": False, "prefill_gate_min_tokens": 256}
    policy, gate = launch.split_knobs(knobs)
    assert policy == {"prefill_weight": 0.5} and gate == {"prefill_gate": False, "prefill_gate_min_tokens": 256}
    assert launch.knob_flags(knobs) == [
        "--prefill-weight", "0.5", "--no-prefill-gate", "--prefill-gate-min-tokens", "256",
    ]  # fmt: skip
    # the flags are the gateway's own: serve parses them
    serve = build_parser().parse_args(["serve", *launch.knob_flags(knobs)])
    assert serve.prefill_weight == 0.5 and serve.prefill_gate is False and serve.prefill_gate_min_tokens == 256
    with pytest.raises(ValueError, match="not knob=value"):
        launch.parse_variant("cache_aware:request_timeout_s=3")


def test_reply_token_reuse_variant_becomes_a_serve_flag() -> None:
    name, knobs = launch.parse_variant("oracle:reply_token_reuse=off")
    assert name == "oracle" and knobs == {"reply_token_reuse": False}
    assert launch.knob_flags(knobs) == ["--no-reply-token-reuse"]
    serve = build_parser().parse_args(["serve", *launch.knob_flags(knobs)])
    assert serve.reply_token_reuse is False
    assert build_parser().parse_args(["serve"]).reply_token_reuse is True

