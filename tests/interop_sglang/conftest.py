"""Fixtures: SGLang's own ``--grpc-mode`` server (stand-in scheduler) and the gateway in front.

The suite skips, with the reason, where the interop virtualenv or the model folder is
missing (``scripts/interop/setup-sglang.sh`` builds both; ``scripts/run-interop-sglang``
runs it and then this suite). One server and one gateway serve the whole session.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.interop_sglang import servers


@pytest.fixture(scope="session")
def interop_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("interop-sglang")


@pytest.fixture(scope="session")
def sglang_grpc(interop_dir: Path) -> Iterator[servers.Process]:
    reason = servers.unavailable_reason(require_opt_in=True)
    if reason:
        print(f"interop-sglang skipped: {reason}", file=sys.stderr)
        pytest.skip(reason)
    with servers.running(servers.start_sglang(interop_dir, grpc=True)) as proc:
        yield proc


@pytest.fixture(scope="session")
def sglang_http(interop_dir: Path, sglang_grpc: servers.Process) -> Iterator[servers.Process]:
    """SGLang's own OpenAI HTTP server, same stand-in scheduler: the reference frontend. Its
    scheduler publishes KV events through SGLang's own publisher, connecting out to an address
    a gateway binds, its replay socket bound on 127.0.0.1 (nothing beyond loopback)."""
    port = servers.free_port(span=2, ports=servers.EVENT_PORTS)
    events = {"publisher": "zmq", "endpoint": f"tcp://127.0.0.1:{port}",
              "replay_endpoint": f"tcp://127.0.0.1:{port + 1}", "topic": "kv"}
    with servers.running(servers.start_sglang(
            interop_dir, grpc=False, extra_args=["--kv-events-config", json.dumps(events)])) as proc:
        proc.extra.update(kv_events=events["endpoint"], kv_replay=events["replay_endpoint"])
        yield proc


@pytest.fixture(scope="session")
def gateway(interop_dir: Path, sglang_grpc: servers.Process) -> Iterator[servers.Process]:
    with servers.running(servers.start_gateway(interop_dir, sglang_grpc.extra["url"])) as proc:
        yield proc


@pytest.fixture(scope="session")
def gateway_over_http(interop_dir: Path, sglang_http: servers.Process) -> Iterator[servers.Process]:
    """The gateway in front of SGLang's own HTTP server as an SGLang-HTTP worker (``/generate``
    with token ids); HTTP workers do not serve their tokenizer, so it is given."""
    workdir = interop_dir / "over-http"
    workdir.mkdir(exist_ok=True)
    with servers.running(servers.start_gateway(
            workdir, sglang_http.extra["url"], extra_args=["--tokenizer-path", str(servers.MODEL_DIR)])) as proc:
        servers.wait_for_model(proc)  # a slow first probe leaves the worker to the background retries
        yield proc


@pytest.fixture(scope="session")
def gateway_over_http_auto(interop_dir: Path, sglang_http: servers.Process) -> Iterator[servers.Process]:
    """The gateway reading SGLang's own KV-event publisher from what its HTTP server reports
    (``--kv-events-zmq auto``: ``kv_events_config`` in ``/get_server_info``)."""
    workdir = interop_dir / "auto-over-http"
    workdir.mkdir(exist_ok=True)
    with servers.running(servers.start_gateway(
            workdir, sglang_http.extra["url"],
            extra_args=["--tokenizer-path", str(servers.MODEL_DIR), "--kv-events", "--kv-events-zmq", "auto"])) as proc:
        servers.wait_for_model(proc)
        yield proc


@pytest.fixture(params=["grpc-worker", "http-worker"])
def front(request: pytest.FixtureRequest) -> servers.Process:
    """The gateway in front of either kind of SGLang worker."""
    name = "gateway" if request.param == "grpc-worker" else "gateway_over_http"
    proc: servers.Process = request.getfixturevalue(name)
    return proc


@pytest.fixture()
def recording(sglang_grpc: servers.Process) -> servers.Recording:
    """What the stand-in scheduler receives from now on."""
    rec: servers.Recording = sglang_grpc.extra["recording"]
    rec.mark()
    return rec


@pytest.fixture(scope="session")
def model() -> str:
    return servers.SERVED_MODEL


@pytest.fixture()
def client(gateway: servers.Process) -> Iterator[Any]:
    import openai

    c = openai.OpenAI(base_url=gateway.extra["url"] + "/v1", api_key="interop", max_retries=0, timeout=60)
    yield c
    c.close()


def run_grpc_client(port: int, *args: str, timeout: float = 120.0) -> dict[str, Any]:
    """Run the independent official-stub client (its own process) against the servicer."""
    import json

    out = subprocess.run([sys.executable, "-m", "tests.interop_sglang.grpc_client", *args[:1], str(port), *args[1:]],
                         capture_output=True, text=True, timeout=timeout, cwd=servers.REPO, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"grpc_client {args} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout)
