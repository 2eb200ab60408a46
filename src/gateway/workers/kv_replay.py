"""Missed batches asked again of a rank's replay socket (vLLM, SGLang), so that a short loss
of its event stream does not cost the rank's share of the tree.

The engine keeps its last ``buffer_steps`` batches per publisher and serves them on a ROUTER
socket it binds (``replay_endpoint`` in its ``--kv-events-config``). A request is an empty
delimiter frame and the first wanted sequence number (8 bytes, big-endian); the answer is
one message per kept batch from that number on, then an end mark whose sequence is END,
the 8 bytes of -1, and whose batch is empty. vLLM answers ``[b"", sequence, batch]``;
SGLang (0.5.23) puts the topic first, ``[b"", topic, sequence, batch]``, as on its live
socket; both are read. A REQ socket takes one reply per request,
so the gateway asks through a DEALER socket of its own for each gap, and stops reading at
the end mark, at the last batch it wants, or at its time limit. The gap's width is bounded
too: a wider one than the publisher keeps by default is not asked for. The feeder applies
what came back only when it closes the gap, and otherwise resets the rank's share as it
does without a replay endpoint.
"""

from __future__ import annotations

import time

import zmq
import zmq.asyncio

END = b"\xff" * 8  # the answer's end mark: -1 as 8 signed big-endian bytes
TIMEOUT_S = 1.0  # the longest a feed waits for one replay (its frames queue meanwhile)
MAX_BATCHES = 10_000  # vLLM's default buffer_steps: a wider gap cannot be filled


async def fetch(
    address: str, first: int, last: int, *, timeout_s: float = TIMEOUT_S, max_batches: int = MAX_BATCHES
) -> list[tuple[int, bytes]]:
    """``(sequence, batch)`` of the publisher's batches ``first``..``last`` (its own numbers)
    that its replay socket at ``address`` gives back within ``timeout_s``, in order; none
    when the gap is wider than ``max_batches``. The caller checks they close the gap."""
    if last < first or last - first + 1 > max_batches:
        return []
    sock = zmq.asyncio.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    out: list[tuple[int, bytes]] = []
    try:
        sock.connect(address)
        await sock.send_multipart([b"", first.to_bytes(8, "big")])
        deadline = time.monotonic() + timeout_s
        while (left := deadline - time.monotonic()) > 0 and await sock.poll(left * 1000):
            frames = await sock.recv_multipart()
            if len(frames) not in (3, 4) or frames[0] or len(frames[-2]) != 8 or frames[-2] == END:
                break  # the end mark, or not an answer
            seq = int.from_bytes(frames[-2], "big")
            if seq > last:
                break
            if seq >= first:
                out.append((seq, frames[-1]))
            if seq == last:
                break
    finally:
        sock.close(linger=0)
    return out
