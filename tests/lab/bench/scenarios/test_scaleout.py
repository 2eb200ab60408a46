"""`token-gateway bench scaleout` (gateway_lab.bench.scenarios.scaleout), the parts that
need no fleet: reading series, totals, histogram quantiles and sync budgets from several
processes' expositions, the process tree's CPU, the serve command line, wrk's seeded prompts, and each setup's
gateways started and stopped through the launcher."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.exposition import generate_latest

from gateway_lab.bench.scenarios import scaleout as scenario


def _process(published: float, lags: list[float]) -> str:
    registry = CollectorRegistry()
    Counter("token_gateway_sync_published_bytes", "b", registry=registry).inc(published)
    Counter("token_gateway_sync_published_decisions", "d", registry=registry).inc(10)
    Counter("token_gateway_sync_same_host_applied", "s", registry=registry).inc(7)
    lag = Histogram("token_gateway_sync_lag_seconds", "l", buckets=(0.001, 0.01, 0.1), registry=registry)
    for value in lags:
        lag.observe(value)
    return generate_latest(registry).decode()


def test_series_totals_and_quantiles_over_every_process() -> None:
    texts = [_process(1000, [0.0005] * 50), _process(3000, [0.005] * 50)]
    assert scenario.total(texts, "token_gateway_sync_published_bytes_total") == 4000
    assert len(scenario.series(texts, "token_gateway_sync_lag_seconds_count")) == 2
    p50 = scenario.histogram_quantile(texts, "token_gateway_sync_lag_seconds", 0.5)
    assert p50 is not None and p50 == pytest.approx(0.001)  # half the samples fall in the first bucket
    p99 = scenario.histogram_quantile(texts, "token_gateway_sync_lag_seconds", 0.99)
    assert p99 is not None and 0.001 < p99 <= 0.01
    assert scenario.histogram_quantile(texts, "no_such_histogram", 0.5) is None
    budgets = scenario.sync_budgets(texts, requests=100)
    assert budgets["published_bytes_per_request"] == 40.0 and budgets["decisions_published"] == 20
    assert budgets["lag_p50_ms"] == pytest.approx(1.0) and budgets["same_host_applied"] == 14


def test_the_cpu_of_a_process_tree_counts_its_children() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.2: pass\ntime.sleep(5)"])
    try:
        for _ in range(100):  # bounded: until the child has burnt its CPU
            if scenario.cpu_seconds(child.pid) >= 0.15:
                break
            time.sleep(0.05)
        burnt = scenario.cpu_seconds(child.pid)
        assert burnt > 0 and child.pid in scenario.children(os.getpid())
        assert scenario.tree_cpu(os.getpid()) >= scenario.cpu_seconds(os.getpid()) + 0.9 * burnt
        assert "time.process_time" in scenario.cmdline(child.pid)
    finally:
        child.kill()
        child.wait()
    assert scenario.children(2**22 + 777) == [] and scenario.cmdline(2**22 + 777) == ""


def test_the_serve_command_line() -> None:
    argv = scenario.serve_argv(["grpc://a:1"], "/scratch", "--processes", "2")
    assert argv[1:4] == ["-m", "gateway", "serve"] and argv[-2:] == ["--processes", "2"]
    assert argv[argv.index("--worker-urls") + 1] == "grpc://a:1" and "--tokenizer-cache-dir" in argv
    assert scenario.load_note().startswith("load ")


def test_each_wrk_run_draws_its_own_prompts() -> None:
    """An unseeded Lua generator replays one sequence of words: a later round would resend
    an earlier round's prompts, which the fleet and the trees already hold."""
    a, b = scenario.wrk_script("m", 1), scenario.wrk_script("m", 2)
    assert "math.randomseed(1)" in a and "math.randomseed(2)" in b
    assert a.replace("math.randomseed(1)", "") == b.replace("math.randomseed(2)", "")
    assert '"model":"m"' in a and "math.random(#words)" in a


def test_the_parked_set_gets_its_own_ratio_line() -> None:
    row = {"req_s": 100.0, "gateway_cpu_ms_per_request": 1.0, "cpu_ms_per_request": {"gateway serve": 1.0}}
    tp = {"workers": 4, "concurrency": 32, "requests_per_round": 10, "median_req_s": {"one": 100.0, scenario.PARKED: 90.0},
          "rounds": {"one": [row], scenario.PARKED: [{**row, "req_s": 90.0}]}, "ratio": 1.0, "load_1m_seen": [1.0],
          "parked_ratio": 0.9, "parked_round_pair_ratios": [0.9]}  # fmt: skip
    text = "\n".join(scenario.throughput_markdown(tp))
    assert f"Ratio {scenario.PARKED} / one (the set parking a process on a busy host): 0.9 (round pairs [0.9])" in text


class _Nats:
    made: list[_Nats] = []

    def __init__(self) -> None:
        self.url, self.running = "nats://127.0.0.1:4999", False
        _Nats.made.append(self)

    async def start(self) -> _Nats:
        self.running = True
        return self

    async def stop(self) -> None:
        self.running = False


@pytest.mark.parametrize(("setup", "count", "flags", "nats"), [
    ("one", 1, [], False),
    ("processes-2", 1, ["--processes", "2", "--sync-encoding", "blocks"], False),
    ("replicas-sync-tokens", 2, ["--sync-url", "nats://127.0.0.1:4999", "--sync-encoding", "tokens"], True),
    ("replicas-nosync", 2, [], False),
])  # fmt: skip
async def test_each_setup_starts_its_gateways_through_the_launcher(
    monkeypatch: pytest.MonkeyPatch, setup: str, count: int, flags: list[str], nats: bool
) -> None:
    started: list[dict[str, Any]] = []

    @contextlib.asynccontextmanager
    async def gateway(kind: str, urls: list[str], policy: str, **options: Any) -> AsyncIterator[str]:
        started.append(options)
        yield f"http://gw{len(started)}"
        options["stopped"] = True

    monkeypatch.setattr(scenario.launch, "gateway", gateway)
    monkeypatch.setattr(scenario, "LocalNatsServer", _Nats)
    _Nats.made.clear()
    async with scenario.gateways(setup, ["grpc://a:1"], "/scratch") as gws:
        assert len(gws) == count and len(set(gws)) == count
        assert all(not o.get("stopped") for o in started) and all(n.running for n in _Nats.made)
    assert len(started) == count and all(o["stopped"] and o["stop_timeout_s"] == 20 for o in started)
    assert all(o["argv"][-len(flags):] == flags for o in started if flags)
    assert all("--sync-url" not in o["argv"] for o in started if not nats)
    assert bool(_Nats.made) == nats and not any(n.running for n in _Nats.made)


@pytest.mark.parametrize("setup", ["one", "processes-2", "replicas-sync", "replicas-nosync"])
async def test_a_policy_variant_reaches_every_gateway_of_a_setup(monkeypatch: pytest.MonkeyPatch, setup: str) -> None:
    started: list[dict[str, Any]] = []

    @contextlib.asynccontextmanager
    async def gateway(kind: str, urls: list[str], policy: str, **options: Any) -> AsyncIterator[str]:
        started.append(options)
        yield f"http://gw{len(started)}"

    monkeypatch.setattr(scenario.launch, "gateway", gateway)
    monkeypatch.setattr(scenario, "LocalNatsServer", _Nats)
    flags = scenario.variant_flags("cache_aware:cold_hash_slack=0.5")
    assert flags == ["--cold-hash-slack", "0.5"]
    async with scenario.gateways(setup, ["grpc://a:1"], "/scratch", *flags):
        pass
    assert started and all(o["argv"][o["argv"].index("--cold-hash-slack") + 1] == "0.5" for o in started)
    assert scenario.variant_flags("cache_aware") == []
    with pytest.raises(SystemExit, match="runs cache_aware"):
        scenario.variant_flags("prefix_hash:load_factor=2")
