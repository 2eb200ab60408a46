"""Loopback ports for the lab's children that must be told where to listen (a peer, nginx,
a worker process), taken from the kernel rather than guessed."""

from __future__ import annotations

import socket


def free_ports(n: int = 1) -> list[int]:
    """``n`` distinct loopback ports the kernel just handed out (held together while
    they are picked, then released), for a child that must be told its port."""
    socks: list[socket.socket] = []
    try:
        for _ in range(n):
            s = socket.socket()
            socks.append(s)
            s.bind(("127.0.0.1", 0))
        return [int(s.getsockname()[1]) for s in socks]
    finally:
        for s in socks:
            s.close()


def free_port() -> int:
    """One loopback port the kernel just handed out (nothing listens on it once returned)."""
    return free_ports(1)[0]
