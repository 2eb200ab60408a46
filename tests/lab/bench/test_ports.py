"""Loopback ports for children (gateway_lab/bench/ports.py): distinct, and free once handed out."""

from __future__ import annotations

import socket

from gateway_lab.bench import ports


def test_free_ports_are_distinct_and_free() -> None:
    picked = ports.free_ports(3)
    assert len(set(picked)) == 3 and all(0 < p < 65536 for p in picked)
    with socket.socket() as s:
        s.bind(("127.0.0.1", ports.free_port()))  # nothing holds it
