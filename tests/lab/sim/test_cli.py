"""The sim-worker command as a process: fleet hosting, SIGTERM counters, exit fault, official stubs."""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import sys
from pathlib import Path

import grpc
import pytest

from gateway.proto import sglang_scheduler_pb2 as pb
from gateway.proto import sglang_scheduler_pb2_grpc as pb_grpc
from gateway_lab.sim.fleet import SubprocessFleet

from .conftest import PROMPT, ZERO, address, by_index, cfg, collect, request

OFFICIAL_CLIENT = Path(__file__).resolve().parent / "official_client.py"

pytestmark = pytest.mark.slow


def generate_sync(url: str, req: pb.GenerateRequest) -> list[pb.GenerateResponse]:
    with grpc.insecure_channel(address(url)) as ch:
        return list(pb_grpc.SglangSchedulerStub(ch).Generate(req, timeout=20))


def test_fleet_ready_line_and_sigterm_counters() -> None:
    with SubprocessFleet(3, ZERO) as fleet:
        assert len(fleet.urls) == 3 and len(set(fleet.urls)) == 3
        assert all(u.startswith("grpc://127.0.0.1:") for u in fleet.urls)
        assert fleet.bootstrap_ports == [None, None, None]
        for i, url in enumerate(fleet.urls):
            for _ in range(i + 1):
                out = by_index(generate_sync(url, request(PROMPT, max_new=3)))[0].complete
                assert out.completion_tokens == 3
    assert fleet.returncode == 0
    counters = fleet.counters
    assert counters is not None and counters["event"] == "counters"
    workers = counters["workers"]
    assert [w["url"] for w in workers] == fleet.urls
    assert [w["requests"] for w in workers] == [1, 2, 3]
    assert [w["generated_tokens"] for w in workers] == [3, 6, 9]
    assert workers[2]["cached_tokens"] == 64 and workers[2]["cache_hit_rate"] > 0


def free_port_pair() -> int:
    """A port P with P and P+1 free right now (bounded search)."""
    for _ in range(50):
        with socket.socket() as a:
            a.bind(("127.0.0.1", 0))
            port = a.getsockname()[1]
            with socket.socket() as b:
                try:
                    b.bind(("127.0.0.1", port + 1))
                except OSError:
                    continue
        return port
    raise RuntimeError("no free consecutive ports")


def test_consecutive_ports_prefill_roles_and_interrupt() -> None:
    port = free_port_pair()
    fleet = SubprocessFleet(2, cfg(role="prefill"), extra_args=["--port", str(port)])
    with pytest.raises(KeyboardInterrupt), fleet:
        assert fleet.urls == [f"grpc://127.0.0.1:{port}", f"grpc://127.0.0.1:{port + 1}"]
        assert all(isinstance(p, int) and p > 0 for p in fleet.bootstrap_ports)
        with grpc.insecure_channel(address(fleet.urls[1])) as ch:
            info = pb_grpc.SglangSchedulerStub(ch).GetServerInfo(
                pb.GetServerInfoRequest(), timeout=10
            )
        assert dict(info.server_args)["disaggregation_mode"] == "prefill"
        raise KeyboardInterrupt  # a Ctrl-C in the parent still takes the child down
    assert fleet.proc is not None and fleet.proc.poll() is not None


async def test_exit_fault_kills_the_process() -> None:
    fleet = SubprocessFleet(1, cfg(fault_exit_after_requests=0))
    async with fleet:
        async with grpc.aio.insecure_channel(address(fleet.urls[0])) as ch:
            stub = pb_grpc.SglangSchedulerStub(ch)
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await collect(stub, request(PROMPT))
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE
        assert fleet.proc is not None
        assert await asyncio.to_thread(fleet.proc.wait, 10) == 17
    assert fleet.counters is None  # died without a report


def test_official_stub_client_talks_to_the_sim() -> None:
    spec = {"input_ids": PROMPT, "max_new_tokens": 6, "n": 2}
    with SubprocessFleet(1, ZERO) as fleet:
        result = subprocess.run(
            [sys.executable, str(OFFICIAL_CLIENT), address(fleet.urls[0])],
            input=json.dumps(spec),
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert result.returncode == 0, result.stderr
        ours = by_index(generate_sync(fleet.urls[0], request(PROMPT, n=2, max_new=6, stream=True)))
    got = json.loads(result.stdout)
    assert got["model_path"] == "qwen3-sim" and got["eos_token_ids"] == []  # SGLang's placeholder
    assert [m["index"] for m in got["unary"]] == [0, 0]  # SGLang's unary n>1: every index 0
    unary_outputs = sorted(m["output_ids"] for m in got["unary"])
    for i in (0, 1):
        chunks = [m for m in got["stream"] if m["kind"] == "chunk" and m["index"] == i]
        (complete,) = [m for m in got["stream"] if m["kind"] == "complete" and m["index"] == i]
        streamed = [t for c in chunks for t in c["token_ids"]]
        assert streamed == ours[i].streamed_ids
        assert complete["output_ids"] == chunks[-1]["token_ids"]
        assert complete["finish_reason"] == "length" and complete["completion_tokens"] == 6
        assert streamed in unary_outputs


def test_http_fleet_serves_sglangs_http_api_and_reports_counters() -> None:
    import httpx

    with SubprocessFleet(2, ZERO, extra_args=["--http"]) as fleet:
        assert all(u.startswith("http://127.0.0.1:") for u in fleet.urls)
        for url in fleet.urls:
            got = httpx.post(url + "/generate", json={
                "input_ids": list(PROMPT), "sampling_params": {"max_new_tokens": 3, "temperature": 0},
            }, timeout=20).json()
            assert got["meta_info"]["completion_tokens"] == 3
            assert httpx.get(url + "/health", timeout=20).status_code == 200
    assert fleet.returncode == 0 and fleet.counters is not None
    workers = fleet.counters["workers"]
    assert [w["url"] for w in workers] == fleet.urls
    assert [w["requests"] for w in workers] == [1, 1]


def test_http_fleet_can_speak_vllms_api() -> None:
    import httpx

    with SubprocessFleet(1, ZERO, extra_args=["--http", "--http-api", "vllm"]) as fleet:
        models = httpx.get(fleet.urls[0] + "/v1/models", timeout=20).json()
        assert models["data"][0]["id"]
    assert fleet.returncode == 0
