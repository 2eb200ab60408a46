"""What the other processes said, applied here (sync/apply.py): decisions into the pool's
policy, finishes by reference, remote loads summed per worker, lost batches and
undecodable messages counted, peers forgotten on timeout, goodbye or a lost bus."""

from __future__ import annotations

from gateway.policies.base import RemoteDecision, RemoteFinish
from gateway.policies.radix_tree import pack
from gateway.proto import sync_pb2
from gateway.sync.apply import Applier, Peer
from tests.sync.fakes import FakeWorkers


class _Policy:
    remote_finishes = True

    def __init__(self) -> None:
        self.events: list[object] = []

    def on_remote(self, event: object) -> object:
        self.events.append(event)
        return "mark"


class _Router:
    def __init__(self) -> None:
        self.p = _Policy()

    def policy(self, model: str, role: str) -> _Policy:
        return self.p


def _decision(did: int, worker: str = "w0:1", tokens: tuple[int, ...] = (1, 2, 3)) -> sync_pb2.Decision:
    return sync_pb2.Decision(worker_id=worker, model="m", pool="regular", tokens=pack(list(tokens)),
                             prompt_tokens=len(tokens), id=did)


def _setup(now: list[float] | None = None) -> tuple[Applier, _Router, FakeWorkers]:
    router, workers = _Router(), FakeWorkers()
    clock = now or [0.0]
    return Applier("me", router, workers, peer_timeout_s=3.0, clock=lambda: clock[0], clock_ns=lambda: 0), router, workers  # type: ignore[arg-type]


def test_decisions_and_finishes_reach_the_pools_policy() -> None:
    applier, router, _ = _setup()
    batch = sync_pb2.Batch(origin="peer", seq=1, decisions=[_decision(1), _decision(2, worker="unknown:9")])
    batch.finishes.add(decision=1, cached_tokens=2, success=True)
    batch.finishes.add(decision=77, cached_tokens=0, success=True)  # a decision never seen
    batch.finishes.add(worker_id="w1:1", model="m", pool="regular", cached_tokens=5, success=False)
    applier.apply(batch)
    decision, finish, standalone = router.p.events
    assert isinstance(decision, RemoteDecision) and decision.worker_id == "w0:1" and decision.tokens == pack([1, 2, 3])
    assert finish == RemoteFinish("w0:1", "m", 2, True) and standalone == RemoteFinish("w1:1", "m", 5, False)
    st = applier.stats
    assert (st.decisions, st.skipped, st.finishes, st.unresolved_finishes) == (1, 1, 2, 1)


def test_an_extension_continues_a_known_decision_from_its_mark() -> None:
    applier, router, _ = _setup()
    applier.apply(sync_pb2.Batch(origin="peer", seq=1, decisions=[_decision(1)]))
    ext = sync_pb2.Batch(origin="peer", seq=2)
    ext.decisions.add(extends=1, tokens=pack([4, 5]))
    ext.decisions.add(extends=99, tokens=pack([6]))
    applier.apply(ext)
    extension = router.p.events[-1]
    assert extension.mark == "mark" and extension.full == pack([1, 2, 3, 4, 5]) and extension.tokens == pack([4, 5])  # type: ignore[attr-defined]
    assert (applier.stats.extensions, applier.stats.unresolved) == (1, 1)


def test_remote_loads_are_summed_per_worker_and_replaced_by_full_lists() -> None:
    applier, _, workers = _setup()
    a = sync_pb2.Batch(origin="a", seq=1)
    a.loads.add(worker_id="w0:1", in_flight=2, queued_uncached_prefill_tokens=100, running_decode_tokens=10)
    b = sync_pb2.Batch(origin="b", seq=1)
    b.loads.add(worker_id="w0:1", in_flight=1, queued_uncached_prefill_tokens=50)
    applier.apply(a)
    applier.apply(b)
    load = workers.w["w0:1"].remote_load
    assert (load.in_flight, load.queued_prefill_tokens, load.running_decode_tokens) == (3, 150, 10)
    assert applier.remote_in_flight() == 3
    full = sync_pb2.Batch(origin="a", seq=2, full_loads=True)  # a's full list no longer names w0:1
    applier.apply(full)
    assert workers.w["w0:1"].remote_load.in_flight == 1
    applier.apply(sync_pb2.Batch(origin="b", seq=2, goodbye=True))
    assert workers.w["w0:1"].remote_load.in_flight == 0 and "b" not in applier.peers


def test_gaps_own_echoes_and_garbage_are_counted() -> None:
    applier, _, _ = _setup()
    applier.apply(sync_pb2.Batch(origin="p", seq=1))
    applier.apply(sync_pb2.Batch(origin="p", seq=4))
    applier.apply(sync_pb2.Batch(origin="me", seq=1))
    applier.apply_bytes(b"\xff\xff not protobuf")
    st = applier.stats
    assert (st.lost_batches, st.own, st.bad, st.batches) == (2, 1, 1, 2)


def test_silent_peers_expire_and_a_lost_bus_forgets_everyone() -> None:
    now = [0.0]
    applier, _, workers = _setup(now)
    for origin in ("a", "b"):
        batch = sync_pb2.Batch(origin=origin, seq=1)
        batch.loads.add(worker_id="w1:1", in_flight=1)
        applier.apply(batch)
        now[0] += 2.0
    assert applier.expire() == ["a"] and workers.w["w1:1"].remote_load.in_flight == 1
    applier.forget_all()
    assert applier.peers == {} and workers.w["w1:1"].remote_load.in_flight == 0


def test_a_peer_remembers_a_bounded_number_of_decisions() -> None:
    peer = Peer()
    peer.remember(1, ("w", "m", "regular", 0, 0, b"abcd", None))
    peer.remember(1, ("w", "m", "regular", 0, 0, b"ab", None))  # a replay replaces, bytes recounted
    assert peer.known_bytes == 2 and list(peer.known) == [1]


def test_peers_whole_queued_prompts_and_in_flight_are_summed_except_a_same_host_siblings() -> None:
    router, workers = _Router(), FakeWorkers()
    applier = Applier("me", router, workers, host_set="set-1")  # type: ignore[arg-type]
    for origin, host_set, prompts in (("replica", "", 2176), ("other-set", "set-2", 1000), ("sibling", "set-1", 4000)):
        batch = sync_pb2.Batch(origin=origin, seq=1, host_set=host_set)
        batch.loads.add(worker_id="w0:1", in_flight=1, queued_uncached_prefill_tokens=128, queued_prompt_tokens=prompts)
        applier.apply(batch)
    w = workers.w["w0:1"]
    assert w.remote_load.in_flight == 3 and w.remote_load.queued_prefill_tokens == 384  # every peer's load counts
    assert w.peer_queued_prompt_tokens == 3176  # the sibling's whole prompts come through memory instead
    assert w.peer_in_flight == 2  # and its requests on the worker (its bus figure counts those it holds too)
    first = sync_pb2.Batch(origin="replica", seq=2)  # its prefill done: in flight, nothing queued
    first.loads.add(worker_id="w0:1", in_flight=1, running_decode_tokens=8)
    applier.apply(first)
    assert w.peer_queued_prompt_tokens == 1000
    applier.apply(sync_pb2.Batch(origin="other-set", seq=2, goodbye=True))
    assert w.peer_queued_prompt_tokens == 0 and w.peer_in_flight == 1
    alone = Applier("me", router, workers)  # type: ignore[arg-type]  # outside a set every peer counts
    batch = sync_pb2.Batch(origin="sibling", seq=1, host_set="set-1")
    batch.loads.add(worker_id="w1:1", in_flight=1, queued_prompt_tokens=640)
    alone.apply(batch)
    assert workers.w["w1:1"].peer_queued_prompt_tokens == 640 and workers.w["w1:1"].peer_in_flight == 1


def test_another_processes_kv_events_go_to_the_feeder_in_order() -> None:
    applier, _, _ = _setup()
    heard: list[tuple[str, int, int, bool]] = []
    batch = sync_pb2.Batch(origin="p", seq=1)
    first = batch.kv_events.add(worker_id="w0:1", reset=False)
    first.batch.sequence_number = 3
    first.batch.events.add().cleared.SetInParent()
    batch.kv_events.add(worker_id="w1:1", reset=True).batch.sequence_number = 9
    applier.apply(batch)  # no feeder wired (no --kv-events): counted, nothing else
    assert applier.stats.kv_batches == 2
    applier.on_kv_events = lambda wid, b, reset, part, parts: heard.append((wid, b.sequence_number, len(b.events), reset))
    applier.apply_bytes(batch.SerializeToString())
    applier.apply(sync_pb2.Batch(origin="me", seq=2, kv_events=[batch.kv_events[0]]))  # our own: skipped
    assert heard == [("w0:1", 3, 1, False), ("w1:1", 9, 0, True)] and applier.stats.kv_batches == 4


def test_a_followers_request_for_a_share_goes_to_the_reader_not_the_feed() -> None:
    applier, _, _ = _setup()
    heard: list[str] = []
    asked: list[str] = []
    applier.on_kv_events = lambda wid, b, reset, part, parts: heard.append(wid)
    applier.on_kv_share_wanted = asked.append
    batch = sync_pb2.Batch(origin="p", seq=1)
    batch.kv_events.add(worker_id="w0:1", want_share=True)
    batch.kv_events.add(worker_id="w1:1").batch.sequence_number = 2
    applier.apply(batch)
    assert asked == ["w0:1"] and heard == ["w1:1"]
