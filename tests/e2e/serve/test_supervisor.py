"""``serve --processes 2``: one ready line and shared ports, the set answers /metrics and
/health as one, routing is synced, a dead process is restarted without harming the
other's requests, SIGTERM drains them all. Real processes, real nats-server."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import signal
import sys
from pathlib import Path

import grpc
import httpx
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from prometheus_client.parser import text_string_to_metric_families

from gateway.server.admission import AdmissionConfig
from gateway.server.process_config import ProcessConfig
from gateway.server.supervisor import share_admission
from gateway_lab.bench.serve_process import ServeProcess
from gateway_lab.sim.config import SimConfig
from gateway_lab.sim.fleet import SimFleet

SLOW = SimConfig(step_base_s=0.02, prefill_token_s=0.0, decode_seq_s=0.0, time_scale=1.0)


def test_cpu_shares_pin_each_process_to_its_own_cpus_or_none(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3, 4})
    assert ProcessConfig().cpu_shares(2) == [{0, 1}, {2, 3}]  # equal contiguous shares; the odd one unused
    assert ProcessConfig().cpu_shares(5) == [{0}, {1}, {2}, {3}, {4}]
    assert ProcessConfig().cpu_shares(6) is None  # more processes than CPUs: the kernel balances
    assert ProcessConfig().cpu_shares(1) is None
    assert ProcessConfig(process_cpu_affinity="off").cpu_shares(2) is None


def test_admission_limits_are_split_so_the_set_keeps_the_totals() -> None:
    cfg = AdmissionConfig(max_concurrent_requests=5, max_queued_requests=7, rate_limit_per_s=9.0, rate_limit_burst=3)
    parts = [share_admission(cfg, i, 2) for i in range(2)]
    assert [p.max_concurrent_requests for p in parts] == [3, 2]
    assert [p.max_queued_requests for p in parts] == [4, 3]
    assert [p.rate_limit_per_s for p in parts] == [4.5, 4.5]
    assert [p.rate_limit_burst for p in parts] == [2, 2]
    tiny = share_admission(dataclasses.replace(cfg, max_concurrent_requests=1), 1, 2)
    assert tiny.max_concurrent_requests == 1  # never 0, which would mean "no cap"
    assert share_admission(AdmissionConfig(), 1, 2).max_concurrent_requests == 0  # no cap stays no cap


async def _start(fleet: SimFleet, tmp_path: Path, *extra: str) -> ServeProcess:
    argv = [
        sys.executable, "-m", "gateway", "serve", "--worker-urls", *fleet.urls, "--host", "127.0.0.1",
        "--port", "0", "--grpc-port", "0", "--processes", "2", "--tokenizer-cache-dir", str(tmp_path / "tok"),
        "--sync-heartbeat-s", "0.2", *extra,
    ]  # fmt: skip
    return await ServeProcess.launch(argv, "gateway-set", ready_timeout_s=90, log_dir=tmp_path)


async def _model(http: httpx.AsyncClient, url: str) -> str:
    return str((await http.get(url + "/v1/models")).json()["data"][0]["id"])


def _samples(text: str, name: str) -> list[tuple[dict[str, str], float]]:
    return [(s.labels, s.value) for fam in text_string_to_metric_families(text) for s in fam.samples if s.name == name]


async def _stream(url: str, model: str, tokens: int, started: list[int] | None = None) -> str:
    """One streamed completion on its own connection: 'done', or 'broken' if the connection
    ended. ``started`` gets an entry once the first event arrived."""
    body = {"model": model, "prompt": "a shared system prompt " * 8, "max_tokens": tokens, "stream": True, "ignore_eos": True}
    try:
        async with httpx.AsyncClient(timeout=30, trust_env=False) as http, http.stream("POST", url + "/v1/completions", json=body) as resp:
            lines = []
            async for line in resp.aiter_lines():
                if not lines and started is not None:
                    started.append(1)
                lines.append(line)
        return "done" if "data: [DONE]" in lines else "broken"
    except httpx.HTTPError:
        return "broken"


@pytest.mark.slow
async def test_the_set_shares_its_ports_and_answers_as_one(tmp_path: Path) -> None:
    async with SimFleet.start(2) as fleet:
        gw = await _start(fleet, tmp_path)
        try:
            info = gw.ready_info
            assert info["processes"] == 2 and len(info["pids"]) == 2 and info["sync_url"].startswith("nats://127.0.0.1:")
            async with httpx.AsyncClient(timeout=30, trust_env=False) as http:
                model = await _model(http, gw.url)
            results = await asyncio.gather(*(_stream(gw.url, model, 4) for _ in range(24)))
            assert results == ["done"] * 24
            async with grpc.aio.insecure_channel(info["grpc_target"]) as ch:
                got = await health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=5)
                assert got.status == health_pb2.HealthCheckResponse.SERVING
            async with httpx.AsyncClient(timeout=30, trust_env=False) as http:
                health = (await http.get(gw.url + "/health")).json()
                assert health["processes"]["expected"] == 2 and health["processes"]["alive"] == 2
                shares = ProcessConfig().cpu_shares(2)  # the default: each pinned to its own CPUs
                assert health["processes"]["cpus"] == (None if shares is None else [sorted(c) for c in shares])
                if shares is not None:
                    assert [os.sched_getaffinity(pid) for pid in info["pids"]] == shares
                text = (await http.get(gw.url + "/metrics")).text
            done = _samples(text, "token_gateway_requests_total")
            completions = sum(v for labels, v in done if labels["endpoint"] == "/v1/completions")
            assert completions == 24  # every process's count, whichever one the scrape reached
            assert {labels["process"] for labels, _ in _samples(text, "token_gateway_sync_connected")} == {"0", "1"}
            assert all(v == 1 for _, v in _samples(text, "token_gateway_sync_connected"))
            assert _samples(text, "token_gateway_worker_in_flight")  # the scrape-time collectors survive the merge
            published = sum(v for _, v in _samples(text, "token_gateway_sync_published_decisions_total"))
            applied = sum(v for _, v in _samples(text, "token_gateway_sync_applied_decisions_total"))
            # each decision reached the other process's tree; learned outputs (prompt + output
            # on finish, when the output completes a page) travel as decisions too
            assert published >= 24 and applied == published
            lags = sum(v for _, v in _samples(text, "token_gateway_sync_lag_seconds_count"))
            assert 0 < lags <= applied  # each applied decision's lag observed once (extensions have none)
            # and each went into its process's same-host ring, read by the sibling at its next choice
            written = sum(v for _, v in _samples(text, "token_gateway_sync_same_host_written_total"))
            from_ring = sum(v for _, v in _samples(text, "token_gateway_sync_same_host_applied_total"))
            assert written == 24 and from_ring <= written
        finally:
            assert await gw.stop(timeout_s=20) == 0


@pytest.mark.slow
async def test_a_dead_process_is_restarted_and_the_others_requests_are_unharmed(tmp_path: Path) -> None:
    async with SimFleet.start(2, SLOW) as fleet:
        gw = await _start(fleet, tmp_path)
        try:
            async with httpx.AsyncClient(timeout=30, trust_env=False) as http:
                model = await _model(http, gw.url)
            started: list[int] = []
            streams = [asyncio.create_task(_stream(gw.url, model, 80, started)) for _ in range(8)]
            async with asyncio.timeout(30):
                while len(started) < 8:  # noqa: ASYNC110 (every stream under way before the kill)
                    await asyncio.sleep(0.05)
            victim = gw.ready_info["pids"][0]
            os.kill(victim, signal.SIGKILL)
            results = await asyncio.gather(*streams)
            assert set(results) <= {"done", "broken"}  # none hangs
            async with httpx.AsyncClient(timeout=30, trust_env=False) as http:
                async with asyncio.timeout(60):
                    while True:
                        health = (await http.get(gw.url + "/health")).json()["processes"]
                        if health["alive"] == 2 and health["restarts"] == 1:
                            break
                        await asyncio.sleep(0.2)
                assert victim not in health["pids"]
                shares = ProcessConfig().cpu_shares(2)
                if shares is not None:  # the restarted process is pinned where its predecessor was
                    assert os.sched_getaffinity(health["pids"][0]) == shares[0]
                text = (await http.get(gw.url + "/metrics")).text
            # Every stream the survivor (process 1) took finished; only the victim's broke.
            survivor = sum(v for labels, v in _samples(text, "token_gateway_requests_total")
                           if labels["process"] == "1" and labels["endpoint"] == "/v1/completions")
            assert results.count("done") == survivor
            assert await asyncio.gather(*(_stream(gw.url, model, 2) for _ in range(8))) == ["done"] * 8
            # The dead process's worker requests were cancelled with its connections: none left running.
            def running() -> int:
                return sum(c.samples - c.finished - c.aborted - c.failed for c in (w.counters for w in fleet.workers))

            async with asyncio.timeout(30):
                while running():  # noqa: ASYNC110 (polling the fleet counters)
                    await asyncio.sleep(0.1)
        finally:
            assert await gw.stop(timeout_s=20) == 0


@pytest.mark.slow
async def test_sigterm_drains_every_process(tmp_path: Path) -> None:
    async with SimFleet.start(2, SLOW) as fleet:
        gw = await _start(fleet, tmp_path, "--shutdown-grace-s", "20")
        try:
            async with httpx.AsyncClient(timeout=30, trust_env=False) as http:
                model = await _model(http, gw.url)
            started: list[int] = []
            streams = [asyncio.create_task(_stream(gw.url, model, 60, started)) for _ in range(6)]
            async with asyncio.timeout(30):
                while len(started) < 6:  # noqa: ASYNC110 (every stream under way before the signal)
                    await asyncio.sleep(0.05)
            gw.process.send_signal(signal.SIGTERM)
            assert await asyncio.gather(*streams) == ["done"] * 6
            assert await asyncio.wait_for(gw.process.wait(), 30) == 0
            for pid in gw.ready_info["pids"]:
                with pytest.raises(ProcessLookupError):
                    os.kill(pid, 0)
        finally:
            await gw.stop()


def _run_dir(pid: int, name: str) -> Path:
    """The set's run folder, from a serving process's environment."""
    env = dict(e.split("=", 1) for e in Path(f"/proc/{pid}/environ").read_text().split("\0") if "=" in e)
    return Path(env[name])


@pytest.mark.slow
async def test_a_parked_process_passes_its_connections_to_the_active_one(tmp_path: Path) -> None:
    """The supervisor's word (its run folder's parking.json and SIGUSR1, as it sends them when
    the host has no spare core) moves every new HTTP connection to the active process."""
    from gateway.server.process_set import ENV_RUN_DIR, write_parking

    async with SimFleet.start(2) as fleet:
        gw = await _start(fleet, tmp_path, "--process-parking", "auto")
        try:
            pids = gw.ready_info["pids"]
            write_parking(_run_dir(pids[1], ENV_RUN_DIR), [0])
            for pid in pids:
                os.kill(pid, signal.SIGUSR1)
            async with httpx.AsyncClient(timeout=30, trust_env=False) as http:
                model = await _model(http, gw.url)
                before = (await http.get(gw.url + "/metrics")).text
            results = await asyncio.gather(*(_stream(gw.url, model, 4) for _ in range(16)))  # a connection each
            assert results == ["done"] * 16
            async with httpx.AsyncClient(timeout=30, trust_env=False) as http:
                after = (await http.get(gw.url + "/metrics")).text

            def served(text: str, process: str) -> float:
                return sum(v for labels, v in _samples(text, "token_gateway_requests_total")
                           if labels["process"] == process and labels["endpoint"] == "/v1/completions")  # fmt: skip

            assert served(after, "0") - served(before, "0") == 16 and served(after, "1") == served(before, "1")

            def handoff(name: str, process: str) -> float:
                return sum(v for labels, v in _samples(after, f"token_gateway_process_handoff_{name}_total")
                           if labels["process"] == process)  # fmt: skip

            assert handoff("taken", "0") == handoff("given", "1")  # every connection passed on was taken
            assert handoff("kept", "1") == 0 and handoff("given", "0") == 0
        finally:
            assert await gw.stop(timeout_s=20) == 0
