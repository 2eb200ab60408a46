"""Independent clients see no stall in front of the simulator.

SMG 1.13 waited ~5 s on most requests in front of the simulator and never in front of
SGLang's own server: on every chat request it loads ``config.json`` from the tokenizer
path the worker reports, and the simulator reported its bare tokenizer directory, which
has none; SMG then asked the Hugging Face hub for that path and waited for the lookup
to fail (this machine reaches no network), once per request. The simulator now reports
and serves a model folder with the files a real one has (``gateway_lab.sim.model_dir``).

Two witnesses: official-stub grpc.aio clients (always), and SMG itself when
``scripts/peers.sh`` has installed it (else that test skips and says why). Zero-cost
workers answer in milliseconds, so any request near the 5 s stall fails the bound.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from gateway_lab.sim.fleet import SimFleet

from .conftest import ZERO, address

OFFICIAL_BURST = Path(__file__).resolve().parent / "official_burst.py"
PEERS_PYTHON = Path(__file__).resolve().parents[3] / ".peers-venv" / "bin" / "python"
REQUESTS, IN_FLIGHT = 128, 32
STALL_BOUND_S = 2.0  # a zero-cost request takes milliseconds; SMG's stall was 5 s


async def test_official_stub_clients_see_no_stall_and_a_real_model_folder() -> None:
    async with SimFleet.start(4, ZERO) as fleet:
        spec = json.dumps({"requests": REQUESTS, "concurrency": IN_FLIGHT})
        proc = await asyncio.create_subprocess_exec(
            sys.executable, str(OFFICIAL_BURST), *(address(u) for u in fleet.urls),
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        )
        out, err = await asyncio.wait_for(proc.communicate(spec.encode()), 120)
    assert proc.returncode == 0, err.decode()
    result = json.loads(out)
    latencies = result["latencies"]
    assert len(latencies) == REQUESTS and max(latencies) < STALL_BOUND_S
    for facts in result["facts"]:  # what SMG loads per chat request must be there
        folder = Path(facts["tokenizer_path"])
        assert (folder / "config.json").is_file() and (folder / "tokenizer.json").is_file()


@pytest.mark.skipif(not PEERS_PYTHON.exists(), reason="SMG is not installed (scripts/peers.sh installs it)")
async def test_smg_sees_no_stall() -> None:
    from gateway_lab.bench.peers import PeerProcess
    from gateway_lab.sim.vocab import default_tokenizer_path

    async with SimFleet.start(4, ZERO) as fleet:
        peer = await PeerProcess.start(
            str(PEERS_PYTHON), "smg", fleet.urls, "round_robin", str(default_tokenizer_path()), ready_timeout_s=90,
        )
        try:
            gate = asyncio.Semaphore(IN_FLIGHT)
            latencies: list[float] = []
            async with httpx.AsyncClient(base_url=peer.url, trust_env=False, timeout=30) as client:
                model = (await client.get("/v1/models")).json()["data"][0]["id"]

                async def one(i: int) -> None:
                    async with gate:
                        started = time.perf_counter()
                        body = {"model": model, "messages": [{"role": "user", "content": f"hello {i}"}], "max_tokens": 16}
                        response = await client.post("/v1/chat/completions", json=body)
                        assert response.status_code == 200, response.text
                        latencies.append(time.perf_counter() - started)

                await asyncio.gather(*(one(i) for i in range(REQUESTS)))
        finally:
            await peer.stop()
            peer.remove_log()
    assert statistics.median(latencies) < 1.0 and max(latencies) < STALL_BOUND_S, sorted(latencies)[-5:]
