"""The memory-mapped ring of one writer (sync/mmap_ring.py): records reach a reader in
order; a lapped reader, a slot rewritten while read and a restarted writer are reported,
never delivered torn; a slot is unstamped before its body is overwritten; a sibling's
ring is opened when it appears."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gateway.sync import mmap_ring
from gateway.sync.mmap_ring import RingReader, RingWriter, SiblingRings, ring_bytes

SLOTS = 8
SLOT_BYTES = 64


class _Log:
    def __init__(self) -> None:
        self.records: list[bytes] = []
        self.lost: list[int] = []
        self.restarts = 0

    def drain(self, reader: RingReader) -> int:
        return reader.drain(self.records.append, self.lost.append, self._restarted)

    def _restarted(self) -> None:
        self.restarts += 1


def _pair(tmp_path: Path) -> tuple[RingWriter, RingReader]:
    writer = RingWriter.create(tmp_path / "r", SLOTS, SLOT_BYTES)
    reader = RingReader.open(tmp_path / "r", SLOTS, SLOT_BYTES)
    assert reader is not None
    return writer, reader


def test_records_reach_the_reader_in_order_once(tmp_path: Path) -> None:
    writer, reader = _pair(tmp_path)
    log = _Log()
    assert log.drain(reader) == 0
    writer.write(b"ab", b"c")
    writer.write(b"")
    writer.write(b"x" * writer.room)  # a record as long as a slot holds
    assert log.drain(reader) == 3 and log.drain(reader) == 0
    assert log.records == [b"abc", b"", b"x" * writer.room] and log.lost == [] and log.restarts == 0
    with pytest.raises(ValueError):
        writer.write(b"x" * (writer.room + 1))
    writer.close()
    reader.close()


def test_a_lapped_reader_reports_what_it_missed_and_reads_the_oldest_left(tmp_path: Path) -> None:
    writer, reader = _pair(tmp_path)
    log = _Log()
    for i in range(SLOTS + 3):
        writer.write(bytes([i]))
    assert log.drain(reader) == SLOTS
    assert log.lost == [3] and log.records == [bytes([i]) for i in range(3, SLOTS + 3)]
    writer.close()
    reader.close()


def test_a_restarted_writer_is_reported_and_read_from_its_first_slot(tmp_path: Path) -> None:
    writer, reader = _pair(tmp_path)
    log = _Log()
    writer.write(b"old")
    writer.write(b"old")
    assert log.drain(reader) == 2
    writer.close()
    again = RingWriter.create(tmp_path / "r", SLOTS, SLOT_BYTES)  # the same file, a new epoch
    again.write(b"new")
    assert log.drain(reader) == 1 and log.records[-1] == b"new" and log.restarts == 1
    again.close()
    reader.close()


class _RewrittenWhileRead(bytearray):
    """A reader's view of the ring file whose writer laps the slot being read between the
    reader's copy of the body and its second look at the stamp."""

    def __init__(self, path: Path, writer: RingWriter) -> None:
        super().__init__(path.read_bytes())
        self.path = path
        self.writer = writer

    def __getitem__(self, key: Any) -> Any:
        got = super().__getitem__(key)
        if isinstance(key, slice) and key.start >= mmap_ring.HEADER_BYTES:
            for _ in range(SLOTS):
                self.writer.write(b"later")
            self[:] = self.path.read_bytes()
        return got


def test_a_slot_rewritten_while_read_is_reported_lost_not_delivered(tmp_path: Path) -> None:
    writer = RingWriter.create(tmp_path / "r", SLOTS, SLOT_BYTES)
    writer.write(b"first")
    log = _Log()
    assert log.drain(RingReader(_RewrittenWhileRead(tmp_path / "r", writer), SLOTS, SLOT_BYTES)) == 0
    assert log.records == [] and log.lost == [1]
    writer.close()


class _WatchedSlots(bytearray):
    """A ring's memory that checks, at every body write, that the slot's sequence number
    already reads as no record: a reader that copied the body meanwhile sees the stamp
    change and drops the slot instead of delivering a torn one."""

    def __setitem__(self, key: Any, value: Any) -> None:
        if isinstance(key, slice) and key.start >= mmap_ring.HEADER_BYTES:
            at = mmap_ring.HEADER_BYTES + (key.start - mmap_ring.HEADER_BYTES) // SLOT_BYTES * SLOT_BYTES
            if key.start >= at + 12:  # the body, not the stamp itself
                assert int.from_bytes(self[at : at + 8], "little") == 0, "body written under a valid stamp"
        super().__setitem__(key, value)


def test_a_slot_is_unstamped_before_its_body_is_overwritten() -> None:
    memory = _WatchedSlots(ring_bytes(SLOTS, SLOT_BYTES))
    writer = RingWriter(memory, SLOTS, SLOT_BYTES)
    for i in range(SLOTS + 3):  # past one lap: the first slots are overwritten
        writer.write(b"head", bytes([i]) * 5)
    log = _Log()
    assert log.drain(RingReader(memory, SLOTS, SLOT_BYTES)) == SLOTS
    assert log.records[-1] == b"head" + bytes([SLOTS + 2]) * 5


def test_siblings_rings_are_opened_when_they_appear(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(mmap_ring, "REOPEN_EVERY", 2)
    siblings = SiblingRings(lambda i: tmp_path / f"s-{i}", 1, 3, SLOTS, SLOT_BYTES)
    assert list(siblings.readers()) == []  # none there yet: nothing, no error
    writers = [RingWriter.create(tmp_path / f"s-{i}", SLOTS, SLOT_BYTES) for i in (0, 2)]
    (tmp_path / "s-2").write_bytes(b"short")  # a ring not sized yet is not taken
    assert list(siblings.readers()) == []  # not looked for on this call
    assert [i for i, _ in siblings.readers()] == [0]
    writers.append(RingWriter.create(tmp_path / "s-2", SLOTS, SLOT_BYTES))
    siblings.readers()
    assert sorted(i for i, _ in siblings.readers()) == [0, 2]
    siblings.close()
    for writer in writers:
        writer.close()
