"""SGLang's own per-rank KV-event publishers (its ``ZmqEventPublisher``, run in the interop
virtualenv) read by the gateway's feeder with ``--kv-events-zmq URL=tcp://127.0.0.1:P,tcp://127.0.0.1:R``:
each attention-DP rank's batches reach that rank's share only, the router sends a prompt to the
rank whose share holds it, and a batch lost on the way (dropped from the feed's socket here) is
asked again of SGLang's own replay socket, with no reset. Every socket is on 127.0.0.1: SGLang
connects out to the address the gateway binds, and binds its replay sockets there.

The vLLM suite runs the same check against vLLM's own publisher class (``run_ranks_and_replay``).
Then the whole path with SGLang's HTTP server: ``--kv-events-zmq auto`` reads the publisher from
its ``/get_server_info``, and its scheduler's events teach the gateway's tree."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway.policies.base import RouteRequest
from gateway.workers import zmq_kv_events
from gateway.workers.kv_events import KvEventFeeder
from gateway.workers.zmq_kv_events import parse_sources
from tests.fake_transport import MODEL, FakeTransport, fleet
from tests.interop_sglang import servers
from tests.workers.test_zmq_kv_events import ENGINE, _held, _until

Publishers = tuple[subprocess.Popen[str], int, int]


def start_publishers(python: Path, engine: str, port: int) -> subprocess.Popen[str]:
    """The engine's own publishers for two ranks at ``port`` + rank, their replay sockets at
    ``port`` + 2 + rank (``tests.interop_sglang.standin.kv_publisher``), ready to publish."""
    proc = subprocess.Popen(
        [str(python), "-m", "tests.interop_sglang.standin.kv_publisher", "--engine", engine,
         "--endpoint", f"tcp://127.0.0.1:{port}", "--replay", f"tcp://127.0.0.1:{port + 2}", "--ranks", "2"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=servers.REPO,
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    return proc


@pytest.fixture
def publishers() -> Iterator[Publishers]:
    reason = servers.unavailable_reason(require_opt_in=True)
    if reason:
        print(f"interop-sglang skipped: {reason}", file=sys.stderr)
        pytest.skip(reason)
    # The two ranks' event ports, then their replay ports: from the range no server takes its
    # own ports from (SGLang's server binds more ports than its --port while it starts).
    port = servers.free_port(span=4, ports=servers.EVENT_PORTS)
    proc = start_publishers(servers.VENV / "bin" / "python", "sglang", port)
    try:
        yield proc, port, port + 2
    finally:
        proc.kill()
        proc.wait(timeout=10)


def _publish(proc: subprocess.Popen[str], order: str) -> str:
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(order + "\n")
    proc.stdin.flush()
    return proc.stdout.readline().strip()


@pytest.fixture
def drop_rank1_batch1(monkeypatch: pytest.MonkeyPatch) -> None:
    """Rank 1's batch numbered 1 lost between the engine's socket and the feed."""
    original = zmq_kv_events.RankSubscriber.frames

    async def lossy(self: zmq_kv_events.RankSubscriber) -> AsyncIterator[list[bytes]]:
        async for frames in original(self):
            if (self.rank, int.from_bytes(frames[1], "big")) != (1, 1):
                yield frames

    monkeypatch.setattr(zmq_kv_events.RankSubscriber, "frames", lossy)


async def run_ranks_and_replay(publishers: Publishers) -> None:
    """Both ranks' batches into their own shares, a routing choice made from them, rank 1's
    lost batch filled by the engine's replay socket (``drop_rank1_batch1`` must be active)."""
    proc, port, replay = publishers
    f = await fleet(FakeTransport(f"grpc://{ENGINE}", server_args={"dp_size": 2}), policy="cache_aware")
    entry = f"grpc://{ENGINE}=tcp://127.0.0.1:{port},tcp://127.0.0.1:{replay}"
    feeder = KvEventFeeder(f.registry, f.router, zmq_sources=parse_sources([entry]))
    feeder.start()
    zero, one = feeder.feeds[f"{ENGINE}@0"], feeder.feeds[f"{ENGINE}@1"]
    try:
        await _until(lambda: zero.connected and one.connected)
        # The engine's PUB sockets connect to the feeds' and learn their subscriptions (a PUB
        # drops what none asked for); a loaded host needs a moment.
        await asyncio.sleep(2.0)
        assert _publish(proc, '{"rank": 0, "stored": [[11], null, [1, 2]]}') == "published 0 0"
        assert _publish(proc, '{"rank": 1, "stored": [[21], null, [5, 6]]}') == "published 1 0"
        assert _publish(proc, '{"rank": 1, "stored": [[22], 21, [7, 8]]}') == "published 1 1"  # lost on the way
        assert _publish(proc, '{"rank": 1, "stored": [[23], 22, [9, 10]]}') == "published 1 2"
        await _until(lambda: zero.batches == 1 and one.batches == 3)
        assert _held(f, f"{ENGINE}@1", [5, 6, 7, 8, 9, 10]) == 6 and _held(f, f"{ENGINE}@0", [5, 6]) == 0
        assert _held(f, f"{ENGINE}@0", [1, 2]) == 2 and _held(f, f"{ENGINE}@1", [1, 2]) == 0
        assert (one.replays, one.replays_filled, one.replayed, one.blocks.stats.resets) == (1, 1, 1, 0)
        for prompt, rank in (([5, 6, 7, 8, 9, 10, 99], 1), ([1, 2, 99], 0)):  # what only the events taught
            chosen = f.router.select(RouteRequest(token_ids=prompt, model=MODEL, request_id=f"r{rank}"))
            assert chosen.worker.id == f"{ENGINE}@{rank}", (prompt, chosen.decision)
        assert _publish(proc, '{"rank": 1, "removed": [22]}') == "published 1 3"
        await _until(lambda: one.batches == 4)
        assert _held(f, f"{ENGINE}@1", [5, 6, 7, 8, 9, 10]) == 2 and one.malformed == zero.malformed == 0
        assert one.wrong_rank == zero.wrong_rank == 0
    finally:
        await feeder.close()


async def test_sglangs_publishers_feed_each_rank_route_and_its_replay_fills_a_gap(
    publishers: Publishers, drop_rank1_batch1: Any,
) -> None:
    await run_ranks_and_replay(publishers)


def until_heard(gateway_url: str, send: Callable[[list[int]], None], block: int) -> None:
    """Send ``block``-token prompts straight to the engine until the gateway's feed has a batch.
    The engine's publisher connects out to the address the gateway binds, and a PUB socket drops
    what it sends before the feed's subscription reaches it; on a loaded host that takes seconds."""
    deadline = time.monotonic() + 60
    for k in range(1_000_000):
        (row,) = httpx.get(gateway_url + "/workers", timeout=10).json()["workers"]
        if row["kv_events"]["batches"] > 0:
            return
        assert time.monotonic() < deadline, row["kv_events"]
        send([90_000 + k * block + i for i in range(block)])
        time.sleep(0.5)


def test_auto_finds_sglangs_publisher_in_its_server_info_and_learns_from_it(
    gateway_over_http_auto: servers.Process, sglang_http: servers.Process
) -> None:
    """``--kv-events-zmq auto`` against SGLang's own HTTP server: the publisher and replay socket
    its ``/get_server_info`` reports (``kv_events_config``) are the feed's, and a prompt sent
    straight to SGLang (not routed by the gateway) is learned from the events its scheduler
    publishes through SGLang's own publisher."""
    url = gateway_over_http_auto.extra["url"]
    (row,) = httpx.get(url + "/workers", timeout=10).json()["workers"]
    feed = row["kv_events"]
    assert row["kv_events_problem"] is None and "kv_events" not in row["lacks"], row
    assert row["kv_events_source"] == sglang_http.extra["kv_events"], row
    assert feed["endpoint_from"] == "server_info" and feed["replay_source"] == sglang_http.extra["kv_replay"], feed
    assert feed["connected"] and not feed["stopped"], feed

    prompt = [8000 + k for k in range(200)]
    whole = len(prompt) - len(prompt) % max(1, int(row["page_size"]))

    def learned() -> int:
        (worker,) = httpx.post(url + "/admin/inspect", json={"input_ids": prompt}, timeout=30).json()["workers"]
        return int(worker["raw_match_tokens"])

    def send(ids: list[int]) -> None:
        body = {"input_ids": ids, "sampling_params": {"max_new_tokens": 1}}
        reply = httpx.post(sglang_http.extra["url"] + "/generate", json=body, timeout=60)
        assert reply.status_code == 200, reply.text

    until_heard(url, send, 2)
    assert learned() == 0
    send(prompt)
    deadline, got = time.monotonic() + 15, 0
    while not got and time.monotonic() < deadline:
        got = learned()
        time.sleep(0.1)
    assert got == whole  # the prompt's whole pages, as SGLang's publisher sent them
    (row,) = httpx.get(url + "/workers", timeout=10).json()["workers"]
    assert row["kv_events"]["malformed"] == 0 and row["kv_events"]["wrong_rank"] == 0, row["kv_events"]
