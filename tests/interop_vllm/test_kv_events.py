"""vLLM's own KV-event publishers run for real: found by ``--kv-events-zmq auto`` in what vLLM's
OpenAI server reports (its development-mode ``/server_info``), read per rank, and a lost batch
asked again of vLLM's own replay socket.

Every socket is on 127.0.0.1: vLLM's publisher connects out to the address the gateway binds,
and vLLM binds its replay socket there.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.interop_sglang.servers import Process
from tests.interop_sglang.test_kv_events_zmq import (
    Publishers,
    drop_rank1_batch1,
    run_ranks_and_replay,
    start_publishers,
    until_heard,
)
from tests.interop_vllm import servers

__all__ = ["drop_rank1_batch1"]  # the fixture, shared with the SGLang suite

pytestmark = pytest.mark.timeout(900)  # a vLLM server and a gateway start in the first test


@pytest.fixture
def publishers() -> Iterator[Publishers]:
    reason = servers.unavailable_reason(require_opt_in=True)
    if reason:
        print(f"interop-vllm skipped: {reason}", file=sys.stderr)
        pytest.skip(reason)
    port = servers.free_port(4, servers.EVENT_PORTS)  # the two ranks' event ports, then their replay ports
    proc = start_publishers(servers.VENV / "bin" / "python", "vllm", port)
    try:
        yield proc, port, port + 2
    finally:
        proc.kill()
        proc.wait(timeout=10)


async def test_vllms_publishers_feed_each_rank_route_and_its_replay_fills_a_gap(
    publishers: Publishers, drop_rank1_batch1: Any,
) -> None:
    """vLLM's ``ZmqEventPublisher`` (its sockets, its batch encoding, its replay buffer and
    answer shape) for two data-parallel ranks, into the gateway's feeder and router."""
    await run_ranks_and_replay(publishers)


def _send_straight(vllm: Process, prompt: list[int]) -> None:
    body = {"model": servers.SERVED_MODEL, "prompt": prompt, "max_tokens": 1}
    reply = httpx.post(vllm.extra["url"] + "/v1/completions", json=body, timeout=60)
    assert reply.status_code == 200, reply.text


def test_auto_finds_vllms_publisher_in_its_server_info_and_learns_from_it(
    gateway_http_auto: Process, vllm_http: Process
) -> None:
    """``--kv-events-zmq auto`` against vLLM's OpenAI server (``VLLM_SERVER_DEV_MODE=1``): the
    publisher and replay socket its ``/server_info`` reports are the feed's, and a prompt sent
    straight to vLLM (not routed by the gateway) is learned from vLLM's own events."""
    def workers_row() -> dict[str, Any]:
        (row,) = httpx.get(gateway_http_auto.extra["url"] + "/workers", timeout=10).json()["workers"]
        return dict(row)

    # vLLM collects its host's environment on that route's first call: on a loaded host the
    # join's bounded ask goes unanswered and the report is read by a later ask.
    deadline, row = time.monotonic() + 90, workers_row()
    while row["kv_events_source"] != vllm_http.extra["kv_events"] and time.monotonic() < deadline:
        time.sleep(0.5)
        row = workers_row()
    feed = row["kv_events"]
    assert row["kv_events_problem"] is None and "kv_events" not in row["lacks"], row
    assert row["kv_events_source"] == vllm_http.extra["kv_events"], row
    assert feed["endpoint_from"] == "server_info" and feed["replay_source"] == vllm_http.extra["kv_replay"], feed
    assert feed["connected"] and not feed["stopped"], feed

    prompt = [7000 + k for k in range(200)]
    inspect = gateway_http_auto.extra["url"] + "/admin/inspect"

    def learned() -> int:
        (worker,) = httpx.post(inspect, json={"input_ids": prompt}, timeout=30).json()["workers"]
        return int(worker["raw_match_tokens"])

    until_heard(gateway_http_auto.extra["url"], lambda ids: _send_straight(vllm_http, ids), 64)  # one whole block
    assert learned() == 0
    _send_straight(vllm_http, prompt)
    deadline, got = time.monotonic() + 15, 0
    while not got and time.monotonic() < deadline:
        got = learned()
        time.sleep(0.1)
    assert got == 192  # the prompt's three whole 64-token blocks, as vLLM's publisher sent them
    (row,) = httpx.get(gateway_http_auto.extra["url"] + "/workers", timeout=10).json()["workers"]
    assert row["kv_events"]["malformed"] == 0 and row["kv_events"]["wrong_rank"] == 0, row["kv_events"]


def test_auto_leaves_a_grpc_worker_its_servicers_stream(gateway_grpc: Process) -> None:
    """vLLM's GetServerInfo carries no KV-event configuration: with ``auto`` the gRPC worker
    keeps the servicer's ``SubscribeKvEvents`` relay, and no problem is reported."""
    (row,) = httpx.get(gateway_grpc.extra["url"] + "/workers", timeout=10).json()["workers"]
    assert row["kv_events_problem"] is None and row["kv_events_source"] == "SubscribeKvEvents", row
    assert row["kv_events"]["endpoint_from"] is None, row["kv_events"]
