"""Random ids from buffered OS randomness: the shape ``uuid4().hex`` had, never repeated,
never shared with a forked child."""

from __future__ import annotations

import os
import re
import sys

import pytest

from gateway.protocol import ids
from gateway.protocol.ids import random_hex


def test_ids_are_hex_of_the_asked_length_and_distinct_across_refills() -> None:
    made = [random_hex() for _ in range(3 * ids._BATCH_BYTES // 16 + 7)]  # several refills
    assert all(re.fullmatch(r"[0-9a-f]{32}", i) for i in made)
    assert len(set(made)) == len(made)
    assert re.fullmatch(r"[0-9a-f]{24}", random_hex(12))
    assert len(random_hex(ids._BATCH_BYTES + 8)) == 2 * (ids._BATCH_BYTES + 8)  # larger than a batch


def test_one_system_call_serves_many_ids(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []
    real = os.urandom

    def counting(n: int) -> bytes:
        calls.append(n)
        return real(n)

    monkeypatch.setattr(ids.os, "urandom", counting)
    ids._bytes.forget()
    for _ in range(ids._BATCH_BYTES // 16):
        random_hex()
    assert calls == [ids._BATCH_BYTES]
    random_hex()
    assert calls == [ids._BATCH_BYTES, ids._BATCH_BYTES]


@pytest.mark.skipif(sys.platform == "win32", reason="fork")
def test_a_forked_child_does_not_repeat_the_parents_ids() -> None:
    random_hex()  # the parent holds unspent bytes
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report its next id and leave at once
        os.write(write, random_hex().encode())
        os._exit(0)
    os.close(write)
    os.waitpid(pid, 0)
    child = os.read(read, 64).decode()
    os.close(read)
    assert re.fullmatch(r"[0-9a-f]{32}", child)
    assert child != random_hex()  # the parent's next id came from bytes the child never saw
