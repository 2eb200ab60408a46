"""What this process tells the others (sync/outbox.py): one batch per tick, learned
outputs merged into their pending decision or sent as an extension, finishes that name
their decision, loads published only when changed, and a replay after a reconnect."""

from __future__ import annotations

from gateway.policies.base import Decision, RouteRequest
from gateway.policies.radix_tree import pack
from gateway.proto import common_pb2
from gateway.sync.outbox import Outbox, native_tokens, page_aligned, wire_tokens
from gateway.sync.prefix_book import PrefixBook
from tests.sync.fakes import FakeWorkers


def _box(workers: FakeWorkers, book: PrefixBook | None = None, woken: list[int] | None = None) -> Outbox:
    return Outbox("a", lambda wid: workers.get(wid).load if workers.get(wid) else None,
                  lambda wid: workers.get(wid).info.page_size, clock_ns=lambda: 5, book=book,
                  on_pending=(lambda: woken.append(1)) if woken is not None else (lambda: None))


def _req(n: int, rid: str = "r1", start: int = 100) -> RouteRequest:
    return RouteRequest(list(range(start, start + n)), model="m", request_id=rid)


def test_wire_bytes_and_page_alignment() -> None:
    packed = pack([1, 2, 3])
    assert native_tokens(wire_tokens(packed)) == packed and wire_tokens(packed) == b"\x01\0\0\0\x02\0\0\0\x03\0\0\0"
    assert page_aligned(packed, 2) == pack([1, 2]) and page_aligned(packed, 1) == packed


def test_nothing_to_say_is_no_batch_and_the_bus_is_woken_once_per_tick() -> None:
    woken: list[int] = []
    box = _box(FakeWorkers(), woken=woken)
    assert box.take() is None and not box
    box.dispatched("regular", _req(8), Decision("w0:1", "x"))
    box.dispatched("regular", _req(8, "r2"), Decision("w0:1", "x"))
    assert woken == [1]
    batch = box.take()
    assert batch is not None and batch.origin == "a" and batch.seq == 1 and [d.id for d in batch.decisions] == [1, 2]
    assert box.take() is None


def test_a_learned_output_joins_its_pending_decision_or_extends_a_sent_one() -> None:
    box = _box(FakeWorkers())
    box.dispatched("regular", _req(8), Decision("w0:1", "x"))
    box.learned("regular", _req(8), "w0:1", [1, 2])
    pending = box.take()
    assert pending is not None and len(pending.decisions) == 1 and len(pending.decisions[0].tokens) == 4 * 10
    box.dispatched("regular", _req(8, "r2"), Decision("w0:1", "x"))
    box.take()
    box.learned("regular", _req(8, "r2"), "w0:1", [5, 6, 7])
    later = box.take()
    assert later is not None and later.decisions[0].extends == 2 and len(later.decisions[0].tokens) == 4 * 3
    box.learned("regular", _req(4, "unknown"), "w1:1", [9])  # no decision known: the whole sequence, standalone
    alone = box.take()
    assert alone is not None and alone.decisions[0].prompt_tokens == 0 and len(alone.decisions[0].tokens) == 4 * 5


def test_a_finish_names_its_decision_or_goes_out_in_full() -> None:
    box = _box(FakeWorkers())
    box.dispatched("regular", _req(8), Decision("w0:1", "x"))
    box.finished("regular", _req(8), "w0:1", -3, True)
    box.finished("regular", _req(8, "other"), "w1:1", 2, False)
    batch = box.take()
    assert batch is not None
    known, unknown = batch.finishes
    assert (known.decision, known.cached_tokens, known.success) == (1, 0, True)  # negative counts clamp to 0
    assert (unknown.decision, unknown.worker_id, unknown.model, unknown.success) == (0, "w1:1", "m", False)


def test_loads_go_out_when_changed_scaled_by_the_uncached_share() -> None:
    workers = FakeWorkers()
    box = _box(workers)
    guard = workers.w["w0:1"].load.acquire(100, 10)
    box.dispatched("regular", _req(100), Decision("w0:1", "x", predicted_cached_tokens=75))
    assert box.figures("w0:1") == (1, 25, 0, 100)  # three quarters of the prompt is expected cached; whole: 100
    assert box.figures("gone") == (0, 0, 0, 0)
    first = box.take()
    assert first is not None and [(x.worker_id, x.in_flight, x.queued_uncached_prefill_tokens) for x in first.loads] == [("w0:1", 1, 25)]
    assert first.loads[0].queued_prompt_tokens == 100 and first.host_set == ""
    unchanged = box.take(scan=["w0:1"])  # a heartbeat: sent even when nothing changed
    assert unchanged is not None and list(unchanged.loads) == []
    full = box.take(full=["w0:1", "w1:1"])
    assert full is not None and full.full_loads and [x.worker_id for x in full.loads] == ["w0:1"]  # zeros are left out
    guard.release()
    box.finished("regular", _req(100), "w0:1", 75, True)
    ended = box.take()
    assert ended is not None and [(x.worker_id, x.in_flight) for x in ended.loads] == [("w0:1", 0)]
    bye = box.take(goodbye=True)
    assert bye is not None and bye.goodbye


def test_a_replay_restates_recent_decisions_in_a_new_epoch() -> None:
    book = PrefixBook(4)
    box = _box(FakeWorkers(), book=book)
    assert box.replay() is None
    box.dispatched("regular", _req(8), Decision("w0:1", "x"))
    box.take()
    box.dispatched("regular", _req(8, "r2"), Decision("w1:1", "x"))
    second = box.take()
    assert second is not None and second.decisions[0].prefix_blocks == 2  # the prefix went by reference
    replay = box.replay()
    assert replay is not None and replay.replay and [d.worker_id for d in replay.decisions] == ["w0:1", "w1:1"]
    assert replay.decisions[0].prefix_blocks == 0 and len(replay.decisions[0].tokens) == 4 * 8  # tokens again


def test_a_set_member_names_its_host_set_in_every_batch() -> None:
    workers = FakeWorkers()
    box = Outbox("a", lambda wid: workers.get(wid).load, lambda wid: 1, host_set="set-1")
    workers.w["w0:1"].load.acquire(40, 4)
    box.load_changed("w0:1")
    batch = box.take()
    assert batch is not None and batch.host_set == "set-1" and batch.loads[0].queued_prompt_tokens == 40
    full = box.take(full=["w0:1"])
    assert full is not None and full.host_set == "set-1" and full.loads[0].queued_prompt_tokens == 40


def test_kv_events_read_here_go_out_in_the_ticks_batch() -> None:
    woken: list[int] = []
    box = _box(FakeWorkers(), woken=woken)
    read = common_pb2.KvEventBatch(sequence_number=4)
    read.events.add().removed.block_hashes.extend([7, 8])
    box.kv_events("w0:1", read, False)
    box.kv_events("w1:1", common_pb2.KvEventBatch(sequence_number=2), True)
    assert woken == [1] and box
    batch = box.take()
    assert batch is not None and [(k.worker_id, k.batch.sequence_number, k.reset) for k in batch.kv_events] == [
        ("w0:1", 4, False), ("w1:1", 2, True)]
    assert list(batch.kv_events[0].batch.events[0].removed.block_hashes) == [7, 8]
    assert box.take() is None
    box.kv_share_wanted("w0:1")  # a follower's request for the reader's share: no batch
    asked = box.take()
    assert asked is not None and [(k.worker_id, k.want_share, k.HasField("batch")) for k in asked.kv_events] == [("w0:1", True, False)]
    envelope = box.envelope()  # the numbered messages after a tick too large for its relayed events
    assert (envelope.origin, envelope.seq) == (asked.origin, asked.seq + 1) and not envelope.kv_events
