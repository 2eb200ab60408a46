"""`token-gateway bench faults` (gateway_lab.bench.scenarios.faults): the counters it reads
from a gateway's /metrics, one row per scenario of its results table, a live worker's
faults, and each scenario's sick worker started (and killed) through the launcher."""

from __future__ import annotations

import argparse
import contextlib
from collections import Counter
from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any

import pytest

from gateway.server.config import GatewayConfig
from gateway_lab.bench.scenarios import faults as scenario
from gateway_lab.sim.config import SimConfig
from gateway_lab.sim.faults import SimFaults
from tests.server.http.gateway_app import gateway


async def test_the_counters_come_from_a_real_gateways_metrics() -> None:
    async with gateway(GatewayConfig()) as (state, client):
        await state.add_worker("grpc://w1:1")
        guard = state.registry.get("w1:1").load.acquire(50, 4)  # type: ignore[union-attr]
        state.metrics.retries.labels(worker="w1:1", code="UNAVAILABLE").inc(2)
        counters = await scenario.scrape(client)
        assert counters["in_flight_end"] == 1 and counters["queued_prefill_end"] == 50 and counters["retries"] == 2
        assert counters["http_in_flight_end"] == 0  # the scrape itself is not counted
        guard.release()
        assert (await scenario.scrape(client))["in_flight_end"] == 0


def test_result_rows_with_and_without_counters() -> None:
    measured = scenario.Result("ours", "kill", 40.4, Counter(ok=90, failed=3, hung=0),
                               counters={"resumed": 2, "retries": 5, "breaker_opens": 1})
    assert measured.row() == ["ours", "kill", "40", "90", "3", "0", "2", "5", "0", "1", "0"]
    peer = scenario.Result("smg", "stall", 12.0, Counter(ok=1))
    assert peer.row()[-5:] == ["n/a"] * 5
    assert len(scenario.HEADER) == len(measured.row())


def test_flags() -> None:
    parser = argparse.ArgumentParser()
    scenario.add_arguments(parser)
    args = parser.parse_args(["--scenarios", "kill", "--seconds", "5"])
    assert (args.scenarios, args.seconds, args.gateways, args.engine) == (["kill"], 5.0, ["ours"], "sglang")


def test_a_live_workers_faults_flip_and_reset() -> None:
    worker: Any = SimpleNamespace(faults=SimFaults.from_config(SimConfig()))  # what a SimWorker holds
    scenario.set_faults(worker, "stall")
    assert worker.faults.stall_s == 30.0 and worker.faults.fail_after_tokens == -1
    scenario.set_faults(worker, "flaky")
    assert (worker.faults.stall_s, worker.faults.fail_after_tokens, worker.faults.fail_share) == (0.0, 4, 0.5)
    scenario.set_faults(worker, None)
    assert (worker.faults.stall_s, worker.faults.fail_after_tokens, worker.faults.fail_share) == (0.0, -1, 1.0)


class _Procs:
    def __init__(self) -> None:
        self.urls, self.killed = ["grpc://a:1", "grpc://b:2"], []

    def kill(self, i: int) -> None:
        self.killed.append(i)


@pytest.mark.parametrize("name", scenario.SCENARIOS)
async def test_each_scenario_starts_its_sick_worker_through_the_launcher(monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    started: dict[str, Any] = {}
    procs = _Procs()

    @contextlib.asynccontextmanager
    async def fleet(kind: str, n: int, sim: SimConfig, **options: Any) -> AsyncIterator[_Procs]:
        started.update(kind=kind, n=n, sim=sim, **options)
        yield procs

    @contextlib.asynccontextmanager
    async def gateway(kind: str, urls: list[str], policy: str) -> AsyncIterator[Any]:
        started.update(gateway=kind, urls=urls, policy=policy)
        yield SimpleNamespace(url="http://gw")

    async def drive(url: str, seconds: float, clients: int, deadline_s: float, result: Any, tick: Any) -> None:
        for elapsed in (1.0, 2.0, 3.0, 4.0):  # a third of the way is at 4 s
            tick(elapsed)
        result.outcomes["ok"] += 1

    async def settle(url: str, kind: str) -> dict[str, float]:
        return {"in_flight_end": 0.0}

    monkeypatch.setattr(scenario.launch, "fleet", fleet)
    monkeypatch.setattr(scenario, "start_gateway", gateway)
    monkeypatch.setattr(scenario, "drive", drive)
    monkeypatch.setattr(scenario, "settle", settle)
    args = argparse.Namespace(workers=2, engine="vllm", policy="cache_aware", seconds=12.0, clients=2, deadline_s=5.0)
    result = await scenario.scenario("ours", name, args)
    assert (started["kind"], started["n"], started["extra_args"]) == ("processes", 2, ["--engine", "vllm"])
    assert started["faults"] == ({0: scenario.FAULT_FLAGS[name]} if name in scenario.FAULT_FLAGS else {})
    assert started["urls"] == procs.urls and started["policy"] == ("round_robin" if name == "stall" else "cache_aware")
    assert procs.killed == ([0] if name == "kill" else [])
    assert result.outcomes["ok"] == 1 and result.counters == {"in_flight_end": 0.0}
