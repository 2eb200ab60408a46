"""SGLang's own per-rank KV-event publishers (its ``ZmqEventPublisher``, run in the interop
virtualenv) read by the gateway's feeder with ``--kv-events-zmq URL=tcp://*:P,tcp://*:R``: each
attention-DP rank's batches reach that rank's share only, and a batch lost on the way (dropped
from the feed's socket here) is asked again of SGLang's own replay socket, with no reset."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

from gateway.workers import zmq_kv_events
from gateway.workers.kv_events import KvEventFeeder
from gateway.workers.zmq_kv_events import parse_sources
from tests.fake_transport import FakeTransport, fleet
from tests.interop_sglang import servers
from tests.workers.test_zmq_kv_events import ENGINE, _held, _until


@pytest.fixture
def publishers() -> Iterator[tuple[subprocess.Popen[str], int, int]]:
    reason = servers.unavailable_reason(require_opt_in=True)
    if reason:
        print(f"interop-sglang skipped: {reason}", file=sys.stderr)
        pytest.skip(reason)
    port = servers.free_port(span=4)  # the two ranks' event ports, then their replay ports
    replay = port + 2
    proc = subprocess.Popen(
        [str(servers.VENV / "bin" / "python"), "-m", "tests.interop_sglang.standin.kv_publisher",
         "--endpoint", f"tcp://*:{port}", "--replay", f"tcp://*:{replay}", "--ranks", "2"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=servers.REPO,
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        yield proc, port, replay
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
    """Rank 1's batch numbered 1 lost between SGLang's socket and the feed."""
    original = zmq_kv_events.RankSubscriber.frames

    async def lossy(self: zmq_kv_events.RankSubscriber) -> AsyncIterator[list[bytes]]:
        async for frames in original(self):
            if (self.rank, int.from_bytes(frames[1], "big")) != (1, 1):
                yield frames

    monkeypatch.setattr(zmq_kv_events.RankSubscriber, "frames", lossy)


async def test_sglangs_publishers_feed_each_rank_and_its_replay_fills_a_gap(
    publishers: tuple[subprocess.Popen[str], int, int], drop_rank1_batch1: Any,
) -> None:
    proc, port, replay = publishers
    f = await fleet(FakeTransport(f"grpc://{ENGINE}", server_args={"dp_size": 2}), policy="cache_aware")
    feeder = KvEventFeeder(f.registry, f.router, zmq_sources=parse_sources([f"grpc://{ENGINE}=tcp://*:{port},tcp://*:{replay}"]))
    feeder.start()
    zero, one = feeder.feeds[f"{ENGINE}@0"], feeder.feeds[f"{ENGINE}@1"]
    try:
        await _until(lambda: zero.connected and one.connected)
        await asyncio.sleep(0.5)  # the subscriptions reach SGLang's PUB sockets (a PUB drops what none asked for)
        assert _publish(proc, '{"rank": 0, "stored": [[11], null, [1, 2]]}') == "published 0 0"
        assert _publish(proc, '{"rank": 1, "stored": [[21], null, [5, 6]]}') == "published 1 0"
        assert _publish(proc, '{"rank": 1, "stored": [[22], 21, [7, 8]]}') == "published 1 1"  # lost on the way
        assert _publish(proc, '{"rank": 1, "stored": [[23], 22, [9, 10]]}') == "published 1 2"
        await _until(lambda: zero.batches == 1 and one.batches == 3)
        assert _held(f, f"{ENGINE}@1", [5, 6, 7, 8, 9, 10]) == 6 and _held(f, f"{ENGINE}@0", [5, 6]) == 0
        assert _held(f, f"{ENGINE}@0", [1, 2]) == 2 and _held(f, f"{ENGINE}@1", [1, 2]) == 0
        assert (one.replays, one.replays_filled, one.replayed, one.blocks.stats.resets) == (1, 1, 1, 0)
        assert _publish(proc, '{"rank": 1, "removed": [22]}') == "published 1 3"
        await _until(lambda: one.batches == 4)
        assert _held(f, f"{ENGINE}@1", [5, 6, 7, 8, 9, 10]) == 2 and one.malformed == zero.malformed == 0
    finally:
        await feeder.close()
