"""The same-host ring (sync/host_ring.py): a sibling's decision reaches this process's
policy at its next choice, with no bus; overruns, restarts, unknown workers, long
prompts and a sibling not started yet are handled, never applied torn."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gateway.policies.base import Decision, RemoteDecision, RemoteEvent, RouteRequest, WorkerView
from gateway.policies.cache_aware import CacheAwarePolicy
from gateway.policies.radix_tree import pack
from gateway.sync import host_ring, mmap_ring
from gateway.sync.host_ring import SLOTS, HostRing
from gateway.sync.policy_tap import FanOut

WORKERS = [WorkerView("w0", "grpc://w0:1"), WorkerView("w1", "grpc://w1:1")]


class _Targets:
    """The applier's ``target`` over a fixed set of known workers, recording what it got."""

    def __init__(self, known: set[str]) -> None:
        self.known = known
        self.events: list[RemoteDecision] = []

    def __call__(self, worker_id: str, model: str, pool: str) -> Any:
        if worker_id not in self.known or model != "m" or pool != "regular":
            return None

        def apply(event: RemoteEvent) -> object:
            assert isinstance(event, RemoteDecision)
            self.events.append(event)
            return None

        return apply


def _request(tokens: list[int], rid: str = "r") -> RouteRequest:
    return RouteRequest(token_ids=tokens, model="m", request_id=rid)


def _pair(tmp_path: Path, targets: _Targets) -> tuple[HostRing, HostRing]:
    return HostRing(tmp_path, 0, 2, _Targets(set())), HostRing(tmp_path, 1, 2, targets)


def test_a_sibling_decision_reaches_the_reader_as_a_remote_decision(tmp_path: Path) -> None:
    targets = _Targets({"w0", "w1"})
    writer, reader = _pair(tmp_path, targets)
    assert reader.poll() == 0  # nothing written yet
    writer.dispatched("regular", _request([1, 2, 3]), Decision("w1", "no_match"))
    writer.dispatched("regular", _request([4, 5]), Decision("w0", "no_match"), pack([4, 5]))
    assert reader.poll() == 2
    assert [(e.worker_id, e.model, e.tokens, e.prompt_tokens) for e in targets.events] == [
        ("w1", "m", pack([1, 2, 3]), 0),  # no prompt count: the hot-prefix tracker counts the bus copy
        ("w0", "m", pack([4, 5]), 0),
    ]
    assert reader.poll() == 0 and reader.stats.applied == 2 and writer.stats.written == 2
    writer.close()
    reader.close()


def test_the_reader_policy_routes_the_siblings_prefix_to_its_worker(tmp_path: Path) -> None:
    """The point of the ring: a burst's second request of a prefix follows the first,
    though it reaches another process before the bus does."""
    policy = CacheAwarePolicy(eviction_interval_s=0)
    policy.on_workers_changed(WORKERS)
    writer = HostRing(tmp_path, 0, 2, _Targets(set()))
    reader = HostRing(tmp_path, 1, 2, lambda wid, model, pool: policy.on_remote)
    prompt = list(range(1000, 1512))
    writer.dispatched("regular", _request([*prompt, 1]), Decision("w1", "no_match"))
    reader.poll()
    decision = policy.select(_request([*prompt, 2]), WORKERS)
    assert decision.worker_id == "w1" and decision.reason == "cache_hit"
    writer.close()
    reader.close()
    policy.close()


def test_unknown_workers_are_skipped_and_a_lapped_reader_skips_what_was_overwritten(tmp_path: Path) -> None:
    targets = _Targets({"w0"})
    writer, reader = _pair(tmp_path, targets)
    writer.dispatched("regular", _request([1]), Decision("w9", "no_match"))
    writer.dispatched("other-pool", _request([1]), Decision("w0", "no_match"))
    assert reader.poll() == 0 and reader.stats.skipped == 2
    for i in range(SLOTS + 10):
        writer.dispatched("regular", _request([i + 1]), Decision("w0", "no_match"))
    assert reader.poll() == SLOTS  # the oldest still there onwards
    assert reader.stats.overrun == 10
    assert targets.events[-1].tokens == pack([SLOTS + 10])
    writer.close()
    reader.close()


def test_a_restarted_sibling_is_read_from_its_first_slot(tmp_path: Path) -> None:
    targets = _Targets({"w0"})
    writer, reader = _pair(tmp_path, targets)
    for i in range(3):
        writer.dispatched("regular", _request([i + 1]), Decision("w0", "no_match"))
    assert reader.poll() == 3
    writer.close()
    again = HostRing(tmp_path, 0, 2, _Targets(set()))  # same file, new epoch, head back to 0
    again.dispatched("regular", _request([42]), Decision("w0", "no_match"))
    assert reader.poll() == 1 and targets.events[-1].tokens == pack([42])
    again.close()
    reader.close()


def test_a_prompt_longer_than_a_slot_shares_its_leading_part(tmp_path: Path) -> None:
    targets = _Targets({"w0"})
    writer, reader = _pair(tmp_path, targets)
    long = list(range(1, host_ring.SLOT_BYTES // 4 + 100))
    writer.dispatched("regular", _request(long), Decision("w0", "no_match"))
    assert reader.poll() == 1 and writer.stats.truncated == 1
    got = targets.events[0].tokens
    assert 0 < len(got) < 4 * len(long) and got == pack(long)[: len(got)]
    writer.close()
    reader.close()


def test_a_sibling_that_starts_later_is_found(tmp_path: Path, monkeypatch: Any) -> None:
    monkeypatch.setattr(mmap_ring, "REOPEN_EVERY", 1)
    targets = _Targets({"w0"})
    reader = HostRing(tmp_path, 1, 2, targets)
    assert reader.poll() == 0  # no sibling ring yet: nothing, no error
    writer = HostRing(tmp_path, 0, 2, _Targets(set()))
    writer.dispatched("regular", _request([5]), Decision("w0", "no_match"))
    assert reader.poll() == 1
    writer.close()
    reader.close()


def test_finishes_and_outputs_stay_on_the_bus_and_fan_out_tells_every_sink(tmp_path: Path) -> None:
    targets = _Targets({"w0"})
    writer, reader = _pair(tmp_path, targets)
    told: list[str] = []

    class _Sink:
        def dispatched(self, *a: Any) -> None:
            told.append("dispatched")

        def finished(self, *a: Any) -> None:
            told.append("finished")

        def learned(self, *a: Any) -> None:
            told.append("learned")

    fan = FanOut(_Sink(), writer)
    request = _request([1, 2])
    fan.dispatched("regular", request, Decision("w0", "no_match"))
    fan.finished("regular", request, "w0", 0, True)
    fan.learned("regular", request, "w0", [3])
    assert told == ["dispatched", "finished", "learned"]
    assert reader.poll() == 1 and writer.stats.written == 1  # only the decision went into the ring
    writer.close()
    reader.close()
