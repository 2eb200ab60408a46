"""Requests in prefill shared through memory (sync/host_prefill.py): a sibling's sent
request reaches this process's gate at its next poll and its done releases it; a restart,
an overrun and old age drop what was kept (a lost done must never hold anyone)."""

from __future__ import annotations

from pathlib import Path

from gateway.policies.radix_tree import pack
from gateway.sync import mmap_ring
from gateway.sync.host_prefill import SLOTS, HostPrefill


class _Gate:
    """What the callbacks reach: the keys kept, as the prefill gate keeps them."""

    def __init__(self) -> None:
        self.kept: dict[int, tuple[str, bytes, int]] = {}
        self.done: list[int] = []

    def sent(self, key: int, worker_id: str, prompt: bytes, cached: int) -> None:
        self.kept[key] = (worker_id, prompt, cached)

    def ended(self, key: int) -> None:
        self.kept.pop(key, None)
        self.done.append(key)


def _board(tmp_path: Path, index: int, gate: _Gate, **kw: object) -> HostPrefill:
    return HostPrefill(tmp_path, index, 2, on_sent=gate.sent, on_done=gate.ended, **kw)  # type: ignore[arg-type]


def test_a_siblings_request_in_prefill_is_heard_and_its_end_releases_it(tmp_path: Path) -> None:
    g0, g1 = _Gate(), _Gate()
    writer, reader = _board(tmp_path, 0, g0), _board(tmp_path, 1, g1)
    assert reader.poll() == 0
    prompt = pack(list(range(100)))
    writer.sent(7, "w1", prompt, 32)
    writer.sent(8, "w0", pack([5, 6]), 0)
    assert reader.poll() == 2
    k7, k8 = reader.remote_key(0, 7), reader.remote_key(0, 8)
    assert k7 < 0 and k8 < 0 and k7 != k8
    assert g1.kept == {k7: ("w1", prompt, 32), k8: ("w0", pack([5, 6]), 0)} and reader.kept == 2
    writer.done(7)
    writer.done(99)  # never heard of: nothing to release
    assert reader.poll() == 2
    assert g1.kept == {k8: ("w0", pack([5, 6]), 0)} and g1.done == [k7]
    assert (reader.stats.heard, reader.stats.released, writer.stats.sent) == (2, 1, 2)
    assert g0.kept == {} and writer.poll() == 0  # a process never hears its own
    writer.sent(0, "w1", prompt, 0)  # keys are above zero: the gate's "not tracked" is not written
    writer.sent(9, "", prompt, 0)
    assert reader.poll() == 0
    writer.close()
    reader.close()


def test_a_restarted_sibling_drops_what_its_predecessor_had_in_prefill(tmp_path: Path) -> None:
    g1 = _Gate()
    writer, reader = _board(tmp_path, 0, _Gate()), _board(tmp_path, 1, g1)
    writer.sent(1, "w1", pack([1, 2, 3]), 0)
    assert reader.poll() == 1 and len(g1.kept) == 1
    writer.close()
    again = _board(tmp_path, 0, _Gate())  # the same slot restarted: a new epoch, no done ever comes
    assert reader.poll() == 0
    assert g1.kept == {} and reader.stats.dropped == 1
    again.sent(1, "w0", pack([4]), 0)
    assert reader.poll() == 1 and list(g1.kept.values()) == [("w0", pack([4]), 0)]
    again.close()
    reader.close()


def test_a_reader_that_fell_a_ring_behind_drops_what_it_kept(tmp_path: Path) -> None:
    g1 = _Gate()
    writer, reader = _board(tmp_path, 0, _Gate()), _board(tmp_path, 1, g1)
    writer.sent(1, "w1", pack([1, 2]), 0)
    assert reader.poll() == 1
    for k in range(2, SLOTS + 10):  # its done among records overwritten before they were read
        writer.sent(k, "w1", pack([k]), 0)
        writer.done(k - 1)
    reader.poll()
    assert reader.stats.overrun > 0
    assert reader.remote_key(0, 1) not in g1.kept  # the lost done cannot hold anyone
    writer.close()
    reader.close()


def test_a_request_kept_past_its_age_is_dropped(tmp_path: Path) -> None:
    now = [100.0]
    g1 = _Gate()
    writer = _board(tmp_path, 0, _Gate())
    reader = _board(tmp_path, 1, g1, max_age_s=30.0, clock=lambda: now[0])
    writer.sent(1, "w1", pack([1, 2]), 0)
    reader.poll()
    now[0] += 10
    writer.sent(2, "w1", pack([3, 4]), 0)
    reader.poll()
    now[0] += 25  # the first is 35 s old, the second 25
    reader.poll()
    assert list(g1.kept) == [reader.remote_key(0, 2)] and reader.stats.dropped == 1
    writer.close()
    reader.close()


def test_a_sibling_not_started_yet_is_opened_when_its_ring_appears(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(mmap_ring, "REOPEN_EVERY", 2)
    g1 = _Gate()
    reader = _board(tmp_path, 1, g1)
    assert reader.poll() == 0
    writer = _board(tmp_path, 0, _Gate())
    writer.sent(3, "w1", pack([1]), 0)
    assert reader.poll() == 0  # not looked for on this poll
    assert reader.poll() == 1 and len(g1.kept) == 1
    long = pack(list(range(10_000)))  # longer than a slot: its leading part is kept
    writer.sent(4, "w1", long, 0)
    reader.poll()
    got = g1.kept[reader.remote_key(0, 4)][1]
    assert long.startswith(got) and 0 < len(got) < len(long)
    writer.close()
    reader.close()


def test_what_siblings_have_in_prefill_is_summed_per_worker_at_each_change(tmp_path: Path) -> None:
    """The routing cost's ``remote_queued_prompt_tokens``: whole prompts (not the slot's
    truncated copy), released by a done, dropped with a restarted sibling."""
    told: dict[str, int] = {}
    writer = _board(tmp_path, 0, _Gate())
    reader = HostPrefill(tmp_path, 1, 2, on_sent=_Gate().sent, on_done=_Gate().ended,
                         on_queued=told.__setitem__)  # fmt: skip
    long = pack(list(range(10_000)))  # longer than a slot
    writer.sent(1, "w1", long, 0)
    writer.sent(2, "w1", pack([1, 2, 3]), 0)
    writer.sent(3, "w0", pack([4, 5]), 0)
    reader.poll()
    assert reader.queued_prompt_tokens("w1") == 10_003 and reader.queued_prompt_tokens("w0") == 2
    assert told == {"w1": 10_003, "w0": 2}
    writer.done(1)
    reader.poll()
    assert told["w1"] == 3 and reader.queued_prompt_tokens("w9") == 0
    writer.close()
    again = _board(tmp_path, 0, _Gate())  # a restart: its predecessor's requests are gone
    reader.poll()
    assert told == {"w1": 0, "w0": 0} and reader.queued_prompt_tokens("w1") == 0
    again.close()
    reader.close()


def test_a_siblings_request_counts_on_its_worker_from_sent_to_ended(tmp_path: Path) -> None:
    """The prefill gate's free-slot check: a sibling's request is on its worker from its
    *sent* (a held request never is) past its first token until its *ended*; a restart, an
    overrun and old age drop the counts, and an ended never heard of changes nothing."""
    now = [100.0]
    told: dict[str, int] = {}
    writer = _board(tmp_path, 0, _Gate())
    reader = HostPrefill(tmp_path, 1, 2, on_sent=_Gate().sent, on_done=_Gate().ended, on_in_flight=told.__setitem__,
                         max_flight_s=300.0, clock=lambda: now[0])  # fmt: skip
    writer.sent(1, "w1", pack([1, 2]), 0)
    writer.sent(2, "w1", pack([3, 4]), 0)
    writer.sent(3, "w0", pack([5, 6]), 0)
    reader.poll()
    assert told == {"w1": 2, "w0": 1} and reader.in_flight("w1") == 2
    writer.done(1)  # its first token: decoding on w1, still there
    writer.ended(9)  # never heard of
    reader.poll()
    assert told == {"w1": 2, "w0": 1} and reader.kept == 2
    writer.ended(1)
    writer.done(3)
    writer.ended(3)  # ended before its first token (a failure): done, then ended
    reader.poll()
    assert told == {"w1": 1, "w0": 0} and reader.stats.ended == 2
    now[0] += 301  # a request past any worker call's deadline no longer counts
    writer.sent(4, "w0", pack([7, 8]), 0)
    reader.poll()
    assert told == {"w1": 0, "w0": 1}
    for k in range(5, SLOTS + 10):  # records overwritten before they were read: nothing counted stays
        writer.sent(k, "w1", pack([k]), 0)
        writer.ended(k)
    reader.poll()
    assert reader.stats.overrun > 0 and reader.in_flight("w0") == 0
    writer.close()
    again = _board(tmp_path, 0, _Gate())
    again.sent(1, "w1", pack([1]), 0)
    reader.poll()
    assert reader.in_flight("w1") == 1
    again.close()
    _board(tmp_path, 0, _Gate()).close()  # restarted again: its predecessor's request is gone
    reader.poll()
    assert told["w1"] == 0
    reader.close()


def test_a_record_of_an_unknown_kind_is_a_lost_record(tmp_path: Path) -> None:
    from gateway.sync.host_prefill import _RECORD

    g1 = _Gate()
    writer, reader = _board(tmp_path, 0, _Gate()), _board(tmp_path, 1, g1)
    writer.sent(1, "w1", pack([1, 2]), 0)
    reader.poll()
    writer._ring.write(_RECORD.pack(9, 1, 0, 0, 0))
    reader.poll()
    assert g1.kept == {} and reader.stats.dropped == 1 and reader.in_flight("w1") == 0
    writer.close()
    reader.close()


def test_a_sets_id_is_its_run_folders(tmp_path: Path) -> None:
    from gateway.sync.host_prefill import host_set_id

    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    assert host_set_id(tmp_path / "a") == host_set_id(tmp_path / "a" / ".." / "a") != host_set_id(tmp_path / "b")
