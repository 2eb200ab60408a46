"""SGLang's own server started with ``--page-size 16``: the gateway aligns to the worker's page.

The servicer reports the raw ``page_size`` server argument in GetServerInfo (null unless the
operator set it). Set, it is the worker's effective page, and the gateway must use it and
show where it came from in ``GET /workers``; prompts still reach the scheduler unchanged.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.interop_sglang import expect, servers
from tests.interop_sglang.conftest import run_grpc_client

PAGE = 16


@pytest.fixture(scope="module")
def paged_sglang(interop_dir: Path, sglang_grpc: servers.Process) -> Iterator[servers.Process]:
    # Depends on the session's server only so the environment check (and skip) runs first.
    workdir = interop_dir / "paged"
    workdir.mkdir(exist_ok=True)
    with servers.running(servers.start_sglang(workdir, grpc=True, extra_args=["--page-size", str(PAGE)])) as proc:
        yield proc


@pytest.fixture(scope="module")
def paged_gateway(interop_dir: Path, paged_sglang: servers.Process) -> Iterator[servers.Process]:
    workdir = interop_dir / "paged"
    with servers.running(servers.start_gateway(workdir, paged_sglang.extra["url"])) as proc:
        yield proc


def _worker(gateway: servers.Process) -> dict[str, Any]:
    body = httpx.get(gateway.extra["url"] + "/workers", timeout=10).json()
    workers = body["workers"] if isinstance(body, dict) else body
    [worker] = workers
    return dict(worker)


def test_the_servicer_reports_the_page_size_argument(paged_sglang: servers.Process) -> None:
    out = run_grpc_client(paged_sglang.extra["port"], "info")
    assert out["page_size"] == PAGE


def test_the_gateway_uses_and_shows_the_workers_page_size(paged_gateway: servers.Process) -> None:
    worker = _worker(paged_gateway)
    assert worker["page_size"] == PAGE
    assert worker["page_size_source"] == "server_args.page_size"


def test_requests_are_served_and_prompts_arrive_unchanged(paged_gateway: servers.Process,
                                                          paged_sglang: servers.Process) -> None:
    import openai

    rec: servers.Recording = paged_sglang.extra["recording"]
    rec.mark()
    messages = [{"role": "user", "content": "Name three rivers in Europe. " * 5}]
    with openai.OpenAI(base_url=paged_gateway.extra["url"] + "/v1", api_key="interop", max_retries=0,
                       timeout=60) as client:
        r = client.chat.completions.create(model=servers.SERVED_MODEL, messages=messages, max_tokens=5)
    assert r.usage.completion_tokens == 5
    [got] = rec.generates()
    assert got["input_ids"] == expect.chat_ids(messages)
