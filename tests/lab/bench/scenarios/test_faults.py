"""`token-gateway bench faults` (gateway_lab.bench.scenarios.faults): the counters it reads
from a gateway's /metrics, and one row per scenario of its results table."""

from __future__ import annotations

import argparse
from collections import Counter

from gateway.server.config import GatewayConfig
from gateway_lab.bench.scenarios import faults as scenario
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
