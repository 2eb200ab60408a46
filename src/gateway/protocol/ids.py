"""Random ids (request, response, tool call) without a system call per id.

``uuid.uuid4()`` reads its 16 bytes with ``os.urandom``, which releases the GIL around
the ``getrandom`` system call. On a busy gateway another thread (the tokenizer pool,
gRPC's poller) takes the GIL right there and the request's task waits to get it back,
which under load costs an order of magnitude more than the id itself. The same operating-system randomness read
4 KB at a time serves 256 ids per system call; an id is as unpredictable as before.
"""

from __future__ import annotations

import os
import threading

_BATCH_BYTES = 4096


class _RandomBytes:
    """``os.urandom`` bytes handed out in slices; refilled when spent, emptied in a forked child
    (two processes must not hand out the same bytes)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._buffer = b""
        self._at = 0

    def take(self, n: int) -> bytes:
        with self._lock:
            at = self._at
            if at + n > len(self._buffer):
                self._buffer, at = os.urandom(max(_BATCH_BYTES, n)), 0
            self._at = at + n
            return self._buffer[at : at + n]

    def forget(self) -> None:
        with self._lock:
            self._buffer, self._at = b"", 0


_bytes = _RandomBytes()
os.register_at_fork(after_in_child=_bytes.forget)


def random_hex(nbytes: int = 16) -> str:
    """``2 * nbytes`` hex digits of OS randomness (16 bytes: as long as ``uuid4().hex``)."""
    return _bytes.take(nbytes).hex()
