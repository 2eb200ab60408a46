"""Fixtures: vLLM's own servers (OpenAI HTTP and ``--grpc``) over the stand-in core, and a
gateway in front of each.

The suite skips, with the reason, where the interop virtualenv or the model folder is
missing (``scripts/interop/setup-vllm.sh`` builds both; ``scripts/run-interop-vllm`` runs
it and then this suite). Each server and gateway serves the whole session.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.interop_sglang import servers as common
from tests.interop_vllm import servers


@pytest.fixture(scope="session")
def interop_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("interop-vllm")


def _vllm(interop_dir: Path, transport: str, *extra: str) -> Iterator[common.Process]:
    reason = servers.unavailable_reason(require_opt_in=True)
    if reason:
        print(f"interop-vllm skipped: {reason}", file=sys.stderr)
        pytest.skip(reason)
    with common.running(
        servers.start_vllm(interop_dir, transport=transport, extra_args=list(extra))
    ) as proc:
        yield proc


@pytest.fixture(scope="session")
def vllm_http(interop_dir: Path) -> Iterator[common.Process]:
    yield from _vllm(interop_dir, "http")


@pytest.fixture(scope="session")
def vllm_grpc(interop_dir: Path) -> Iterator[common.Process]:
    yield from _vllm(interop_dir, "grpc")


def _gateway(
    interop_dir: Path, worker: common.Process, name: str, *extra: str
) -> Iterator[common.Process]:
    workdir = interop_dir / name
    workdir.mkdir(exist_ok=True)
    # The tokenizer folder is given (a download from the gRPC servicer has a test of its own).
    with common.running(
        common.start_gateway(
            workdir,
            worker.extra["url"],
            extra_args=["--tokenizer-path", str(common.MODEL_DIR), *extra],
            timeout=servers.GATEWAY_START_S,
        )
    ) as proc:
        common.wait_for_model(proc)
        proc.extra["worker"] = worker
        yield proc


@pytest.fixture(scope="session")
def gateway_http(interop_dir: Path, vllm_http: common.Process) -> Iterator[common.Process]:
    yield from _gateway(interop_dir, vllm_http, "over-http")


@pytest.fixture(scope="session")
def gateway_grpc(interop_dir: Path, vllm_grpc: common.Process) -> Iterator[common.Process]:
    # ``auto`` finds no publisher in vLLM's GetServerInfo: the worker keeps the servicer's stream.
    yield from _gateway(interop_dir, vllm_grpc, "over-grpc", "--kv-events", "--kv-events-zmq", "auto")


@pytest.fixture(scope="session")
def gateway_http_auto(interop_dir: Path, vllm_http: common.Process) -> Iterator[common.Process]:
    """The gateway reading vLLM's own publisher from what its OpenAI server reports."""
    yield from _gateway(
        interop_dir, vllm_http, "auto-over-http", "--policy", "cache_aware", "--kv-events", "--kv-events-zmq", "auto"
    )


@pytest.fixture(scope="session")
def vllm_dp_http(interop_dir: Path) -> Iterator[common.Process]:
    """vLLM's OpenAI server with two data-parallel engines."""
    yield from _vllm(interop_dir, "http", "--data-parallel-size", "2")


@pytest.fixture(scope="session")
def vllm_dp_grpc(interop_dir: Path) -> Iterator[common.Process]:
    """vLLM's ``--grpc`` servicer with two data-parallel engines."""
    yield from _vllm(interop_dir, "grpc", "--data-parallel-size", "2")


def _per_rank_events(worker: common.Process) -> list[str]:
    """The gateway reads each engine's KV-event publisher (rank N at the port + N)."""
    return ["--kv-events", "--kv-events-zmq", f"{worker.extra['url']}={worker.extra['kv_events']}"]


@pytest.fixture(scope="session")
def gateway_dp_http(interop_dir: Path, vllm_dp_http: common.Process) -> Iterator[common.Process]:
    yield from _gateway(
        interop_dir, vllm_dp_http, "dp-over-http", "--policy", "cache_aware", *_per_rank_events(vllm_dp_http)
    )


@pytest.fixture(scope="session")
def gateway_dp_grpc(interop_dir: Path, vllm_dp_grpc: common.Process) -> Iterator[common.Process]:
    yield from _gateway(
        interop_dir, vllm_dp_grpc, "dp-over-grpc", "--policy", "cache_aware", *_per_rank_events(vllm_dp_grpc)
    )


@pytest.fixture(scope="session")
def vllm_embed_http(interop_dir: Path) -> Iterator[common.Process]:
    """vLLM's OpenAI server with a pooling runner: it serves embeddings, not text."""
    yield from _vllm(interop_dir, "http", "--runner", "pooling")


@pytest.fixture(scope="session")
def vllm_embed_grpc(interop_dir: Path) -> Iterator[common.Process]:
    """vLLM's ``--grpc`` servicer with a pooling runner."""
    yield from _vllm(interop_dir, "grpc", "--runner", "pooling")


@pytest.fixture(scope="session")
def gateway_embed_http(interop_dir: Path, vllm_embed_http: common.Process) -> Iterator[common.Process]:
    yield from _gateway(interop_dir, vllm_embed_http, "embed-over-http")


@pytest.fixture(scope="session")
def gateway_embed_grpc(interop_dir: Path, vllm_embed_grpc: common.Process) -> Iterator[common.Process]:
    yield from _gateway(interop_dir, vllm_embed_grpc, "embed-over-grpc")


@pytest.fixture(params=["http", "grpc"])
def embed_front(request: pytest.FixtureRequest) -> common.Process:
    """The gateway in front of a pooling vLLM, over HTTP or gRPC."""
    proc: common.Process = request.getfixturevalue(f"gateway_embed_{request.param}")
    return proc


@pytest.fixture(params=["http", "grpc"])
def dp_front(request: pytest.FixtureRequest) -> common.Process:
    """The gateway in front of a data-parallel vLLM, over HTTP or gRPC."""
    proc: common.Process = request.getfixturevalue(f"gateway_dp_{request.param}")
    return proc


@pytest.fixture(params=["http", "grpc"])
def front(request: pytest.FixtureRequest) -> common.Process:
    """The gateway in front of vLLM's HTTP server or its gRPC servicer."""
    proc: common.Process = request.getfixturevalue(f"gateway_{request.param}")
    return proc


@pytest.fixture()
def recording(front: common.Process) -> common.Recording:
    """What the engine core behind ``front`` receives from now on."""
    rec: common.Recording = front.extra["worker"].extra["recording"]
    rec.mark()
    return rec


@pytest.fixture(scope="session")
def model() -> str:
    return servers.SERVED_MODEL


def _openai(url: str) -> Any:
    import openai

    return openai.OpenAI(base_url=url + "/v1", api_key="interop", max_retries=0, timeout=60)


@pytest.fixture()
def client(front: common.Process) -> Iterator[Any]:
    c = _openai(front.extra["url"])
    yield c
    c.close()


@pytest.fixture()
def direct(vllm_http: common.Process) -> Iterator[Any]:
    """A client of vLLM's own OpenAI server: the reference answer."""
    c = _openai(vllm_http.extra["url"])
    yield c
    c.close()
