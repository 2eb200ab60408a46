"""Run ``token-gateway serve`` as a child process for a benchmark, and always clean it up.

The gateway runs in its own process (and session, so a terminal Ctrl-C reaches only
the benchmark, which then stops its children in order). It announces itself with one
JSON line ``{"event": "ready", "url": ...}`` on stdout; its logs go to a file that is
shown when it fails to start. Every child is also killed at interpreter exit, in case
the benchmark dies before its ``finally`` blocks run.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import json
import os
import signal
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any

import httpx

_LIVE: set[int] = set()  # process-group ids of children still running


def _kill_leftovers() -> None:
    for pgid in list(_LIVE):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGKILL)
        _LIVE.discard(pgid)


atexit.register(_kill_leftovers)


def _log_tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


class ServeProcess:
    """A ``python -m gateway serve ...`` child: started, ready-checked, stopped."""

    def __init__(self, process: asyncio.subprocess.Process, url: str, log_path: Path, drain: asyncio.Task[None]):
        self.process = process
        self.url = url
        self.log_path = log_path
        self._drain = drain
        self.ready_info: dict[str, Any] = {}

    @classmethod
    async def start(
        cls,
        worker_urls: Sequence[str],
        policy: str,
        *,
        extra_args: Sequence[str] = (),
        ready_timeout_s: float = 60.0,
        log_dir: str | Path | None = None,
        env: dict[str, str] | None = None,
    ) -> ServeProcess:
        """Start the gateway on an ephemeral loopback port; return once it is ready to route.

        No ``worker_urls`` or ``policy`` leaves their flags out (``extra_args`` names the
        workers otherwise, e.g. prefill and decode pools). ``env`` replaces the child's
        environment (a benchmark runs another checkout's code with its own ``PYTHONPATH``)."""
        argv = [sys.executable, "-m", "gateway", "serve"]
        argv += ["--worker-urls", *worker_urls] if worker_urls else []
        argv += ["--policy", policy] if policy else []
        argv += ["--host", "127.0.0.1", "--port", "0", *extra_args]
        return await cls.launch(argv, f"gateway-{policy or 'serve'}", ready_timeout_s=ready_timeout_s, log_dir=log_dir, env=env)

    @classmethod
    async def launch(
        cls,
        argv: Sequence[str],
        name: str,
        *,
        ready_timeout_s: float = 60.0,
        log_dir: str | Path | None = None,
        env: dict[str, str] | None = None,
    ) -> ServeProcess:
        """Run ``argv``, wait for its ready line and for ``/readiness``; stop it on any failure."""
        log_file: IO[bytes] = tempfile.NamedTemporaryFile(
            prefix=f"{name}-", suffix=".log", dir=log_dir, delete=False
        )  # closed below: the child keeps its own descriptor
        log_path = Path(log_file.name)
        try:
            process = await asyncio.create_subprocess_exec(
                *argv, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
                stderr=log_file, start_new_session=True, env=env,
            )  # fmt: skip
        finally:
            log_file.close()
        _LIVE.add(process.pid)
        try:
            # asyncio.timeout, not wait_for: on 3.11 wait_for can swallow an outer cancel
            async with asyncio.timeout(ready_timeout_s):
                info = await _read_ready_line(process)
        except BaseException as exc:
            await _terminate(process, 2.0)
            if isinstance(exc, TimeoutError):
                raise RuntimeError(
                    f"{name} not ready after {ready_timeout_s:g}s; log {log_path}:\n{_log_tail(log_path)}"
                ) from None
            if isinstance(exc, EOFError):
                raise RuntimeError(
                    f"{name} exited before it was ready (code {process.returncode}); "
                    f"log {log_path}:\n{_log_tail(log_path)}"
                ) from None
            raise
        served = cls(process, str(info["url"]).rstrip("/"), log_path, asyncio.create_task(_drain(process)))
        served.ready_info = info
        try:
            await served.wait_ready(deadline=time.monotonic() + ready_timeout_s)
        except BaseException:
            await served.stop()
            raise
        return served

    async def wait_ready(self, deadline: float) -> None:
        """Poll ``GET /readiness`` until the gateway knows its workers (200)."""
        async with httpx.AsyncClient(trust_env=False, timeout=2.0) as client:
            while True:
                if self.process.returncode is not None:
                    raise RuntimeError(f"gateway exited (code {self.process.returncode}); log {self.log_path}")
                with contextlib.suppress(httpx.HTTPError):
                    if (await client.get(self.url + "/readiness")).status_code == 200:
                        return
                if time.monotonic() > deadline:
                    raise RuntimeError(f"gateway at {self.url} never became ready; log {self.log_path}")
                await asyncio.sleep(0.1)

    async def stop(self, timeout_s: float = 5.0) -> int | None:
        """SIGTERM the gateway's process group, SIGKILL it after ``timeout_s``; return the exit code."""
        await _terminate(self.process, timeout_s)
        # the group's last writer just died: let the drain read the end, so the pipe closes now
        await asyncio.wait([self._drain], timeout=1.0)
        self._drain.cancel()
        await asyncio.wait([self._drain])  # unlike `await task`, never mistakes its cancel for ours
        return self.process.returncode

    def remove_log(self) -> None:
        with contextlib.suppress(OSError):
            self.log_path.unlink()


async def _read_ready_line(process: asyncio.subprocess.Process) -> dict[str, Any]:
    assert process.stdout is not None
    while True:
        line = await process.stdout.readline()
        if not line:
            await process.wait()
            raise EOFError
        with contextlib.suppress(ValueError):
            message = json.loads(line)
            if isinstance(message, dict) and message.get("event") == "ready" and message.get("url"):
                return message


async def _drain(process: asyncio.subprocess.Process) -> None:
    """Keep reading stdout so the child never blocks on a full pipe."""
    assert process.stdout is not None
    while await process.stdout.read(65536):
        pass


async def _terminate(process: asyncio.subprocess.Process, timeout_s: float) -> None:
    """SIGTERM the group and wait up to ``timeout_s``; then SIGKILL whatever is left of it.

    The SIGKILL also runs when the wait is cancelled (Ctrl-C during shutdown), so a
    cancelled stop never leaves the child behind.
    """
    try:
        if process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGTERM)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout_s):
                    await process.wait()
    finally:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, signal.SIGKILL)
        _LIVE.discard(process.pid)
    await process.wait()
