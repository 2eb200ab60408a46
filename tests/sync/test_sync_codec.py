"""The sync layer's encode (outbox) and apply logic, against fakes: no NATS, no servers."""

from __future__ import annotations

from gateway.policies.base import Decision, RouteRequest, WorkerView
from gateway.proto import sync_pb2
from gateway.sync.apply import Applier
from gateway.sync.outbox import Outbox, page_aligned
from gateway.sync.policy_tap import TappedPolicy
from tests.sync.fakes import WORKERS, FakeRouter, FakeWorkers


def _outbox(workers: FakeWorkers, origin: str = "a", clock: list[int] | None = None) -> Outbox:
    t = clock or [1_000]
    return Outbox(origin, lambda wid: workers.get(wid).load if workers.get(wid) else None,
                  lambda wid: workers.get(wid).info.page_size, clock_ns=lambda: t[0])


def test_a_remote_decision_enters_the_tree_like_a_local_one() -> None:
    src, dst = FakeWorkers(), FakeWorkers()
    local, remote = FakeRouter(), FakeRouter()
    box = _outbox(src)
    tap = TappedPolicy(local.p, "regular", box)
    req = RouteRequest(list(range(100, 164)), model="m", request_id="r1")
    decision = tap.select(req, [WorkerView(w, w) for w in WORKERS])
    tap.on_dispatch(req, decision)
    batch = box.take()
    assert batch is not None and len(batch.decisions) == 1
    Applier("b", remote, dst).apply_bytes(batch.SerializeToString())
    probe = RouteRequest([*list(range(100, 164)), 7, 8], model="m")
    assert remote.p.tree("m").match_packed(remote.p._packed(probe))[1] == local.p.tree("m").match_packed(local.p._packed(probe))[1]
    assert remote.p.tree("m").match_packed(remote.p._packed(probe))[1][decision.worker_id] == 64


def test_only_whole_pages_are_published() -> None:
    workers = FakeWorkers(page=16)
    box = _outbox(workers)
    box.dispatched("regular", RouteRequest(list(range(40)), model="m"), Decision("w0:1", "no_match"))
    batch = box.take()
    assert batch is not None
    d = batch.decisions[0]
    assert len(d.tokens) == 4 * 32 and d.prompt_tokens == 40
    assert page_aligned(b"\0" * 40, 4) == b"\0" * 32


def test_one_batch_per_tick_carries_decisions_finishes_and_absolute_loads() -> None:
    workers = FakeWorkers()
    woken: list[int] = []
    box = Outbox("a", lambda wid: workers.get(wid).load, lambda wid: 1, on_pending=lambda: woken.append(1))
    for i in range(5):
        workers.w["w0:1"].load.acquire(10, 4)
        box.dispatched("regular", RouteRequest([i] * 10, model="m"), Decision("w0:1", "no_match"))
    box.finished("regular", "m", "w0:1", 3, True)
    assert woken == [1]  # one wake-up for the whole tick
    batch = box.take()
    assert batch is not None and len(batch.decisions) == 5 and len(batch.finishes) == 1
    assert [(lo.worker_id, lo.in_flight, lo.queued_prefill_tokens) for lo in batch.loads] == [("w0:1", 5, 50)]
    assert box.take() is None  # nothing new


def test_remote_load_is_summed_into_views_and_healed_by_the_next_figures() -> None:
    src, dst = FakeWorkers(), FakeWorkers()
    box = _outbox(src)
    applier = Applier("b", FakeRouter(), dst)
    guards = [src.w["w1:1"].load.acquire(100, 8) for _ in range(3)]
    box.load_changed("w1:1")
    first = box.take()
    for g in guards[:2]:
        g.release()
    box.load_changed("w1:1")
    second = box.take()
    assert first is not None and second is not None
    applier.apply(first)
    assert dst.w["w1:1"].remote_load.in_flight == 3
    guards[2].release()
    box.load_changed("w1:1")
    third = box.take()  # the second batch is "lost": absolute figures still come out right
    assert third is not None and [lo.in_flight for lo in third.loads] == [0]
    applier.apply(third)
    assert dst.w["w1:1"].remote_load.in_flight == 0
    assert applier.stats.lost_batches == 1


def test_heartbeat_restates_everything_and_silence_or_goodbye_forgets() -> None:
    src, dst = FakeWorkers(), FakeWorkers()
    now = [100.0]
    box = _outbox(src)
    applier = Applier("b", FakeRouter(), dst, peer_timeout_s=3.0, clock=lambda: now[0])
    src.w["w0:1"].load.acquire(5, 5)
    full = box.take(full=WORKERS)
    assert full is not None and full.full_loads
    applier.apply(full)
    assert dst.w["w0:1"].remote_load.in_flight == 1 and len(applier.peers) == 1
    now[0] += 5
    assert applier.expire() == ["a"]
    assert dst.w["w0:1"].remote_load.in_flight == 0
    applier.apply(full)
    bye = box.take(goodbye=True)
    assert bye is not None
    applier.apply(bye)
    assert dst.w["w0:1"].remote_load.in_flight == 0 and not applier.peers


def test_own_foreign_and_unknown_messages_are_skipped() -> None:
    workers = FakeWorkers()
    router = FakeRouter()
    lags: list[float] = []
    applier = Applier("a", router, workers, clock_ns=lambda: 3_000_000, on_lag=lags.append)
    own = sync_pb2.Batch(origin="a", seq=1)
    own.decisions.add(worker_id="w0:1", model="m", pool="regular", tokens=b"\1\0\0\0")
    applier.apply(own)
    applier.apply_bytes(b"\xff\xff not protobuf")
    other = sync_pb2.Batch(origin="z", seq=1)
    other.decisions.add(worker_id="gone:1", model="m", pool="regular", tokens=b"\1\0\0\0", decided_unix_ns=1_000_000)
    other.decisions.add(worker_id="w0:1", model="other-model", pool="regular", tokens=b"\1\0\0\0", decided_unix_ns=1_000_000)
    applier.apply(other)
    st = applier.stats
    assert (st.own, st.bad, st.skipped, st.decisions) == (1, 1, 2, 0)
    assert lags == [0.002, 0.002]
    assert router.p.tree("m").worker_tokens("w0:1") == 0
