"""Fleets of simulated workers, for tests, the demo and benchmarks.

* :class:`SimFleet` runs N workers in this process, on the current event loop
  (``async with SimFleet.start(4, config) as fleet``), with direct access to
  each worker's cache, counters and fault knobs; one can be killed (no grace, as
  a crash) and started again on its port.
* :class:`SubprocessFleet` runs ``python -m gateway sim-worker --num-workers N``
  as a child process (sync or async context manager), learns the addresses
  from its ready line, and on exit stops it with SIGTERM and collects its
  counters; the child is killed if it does not go, or if anything goes wrong.
* :class:`WorkerProcesses` runs each worker in a child process of its own, so one
  worker can be SIGKILLed alone and started again on its port.

The benchmarks start these through ``gateway_lab.bench.launch.fleet``.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import AsyncIterator, Sequence
from typing import Any

from gateway_lab.sim.config import SimConfig, config_to_argv
from gateway_lab.sim.worker import SimTls, SimWorker


class SimFleet:
    """Workers hosted in this process."""

    def __init__(self, workers: list[SimWorker]) -> None:
        self.workers = workers

    @property
    def urls(self) -> list[str]:
        return [w.url for w in self.workers]

    @property
    def bootstrap_ports(self) -> list[int | None]:
        return [w.bootstrap_port for w in self.workers]

    def stats(self) -> list[dict[str, Any]]:
        return [w.stats() for w in self.workers]

    async def kill(self, i: int) -> None:
        """Stop worker ``i`` at once, as a crash would: its streams end without grace."""
        await self.workers[i].kill()

    async def restart(self, i: int) -> None:
        """A fresh worker ``i`` (same settings, an empty cache) on the port it had; it must
        have been killed or stopped first."""
        old = self.workers[i]
        if not old.stopping:
            raise RuntimeError(f"worker {i} ({old.url}) is running: kill it before a restart")
        new = SimWorker(old.config, engine=old.engine)
        await new.start(old.host, old.port, bootstrap_port=old.bootstrap_port or 0, tls=old.tls)
        self.workers[i] = new

    async def stop(self) -> None:
        await asyncio.gather(*(w.stop(grace=0.5) for w in self.workers))

    @classmethod
    @contextlib.asynccontextmanager
    async def start(
        cls,
        n: int = 1,
        config: SimConfig | None = None,
        roles: list[str] | None = None,
        host: str = "127.0.0.1",
        tls: SimTls | None = None,
        engine: str = "sglang",
    ) -> AsyncIterator[SimFleet]:
        """Start ``n`` workers on ephemeral ports; ``roles`` overrides ``config.role`` per worker;
        ``tls`` makes them serve grpcs://; ``engine`` picks the gRPC service (SGLang's, vLLM's or TensorRT-LLM's)."""
        config = config or SimConfig()
        if roles is not None and len(roles) != n:
            raise ValueError(f"got {len(roles)} roles for {n} workers")
        workers = [
            SimWorker(config if roles is None else _with_role(config, roles[i]), engine=engine) for i in range(n)
        ]
        fleet = cls(workers)
        try:
            for w in workers:
                await w.start(host, 0, bootstrap_port=0, tls=tls)
            yield fleet
        finally:
            await fleet.stop()


def _with_role(config: SimConfig, role: str) -> SimConfig:
    return dataclasses.replace(config, role=role)


class SubprocessFleet:
    """``token-gateway sim-worker --num-workers N`` in a child process."""

    def __init__(
        self,
        n: int = 1,
        config: SimConfig | None = None,
        roles: list[str] | None = None,
        *,
        host: str = "127.0.0.1",
        ready_timeout: float = 60.0,
        stop_timeout: float = 10.0,
        python: str = sys.executable,
        extra_args: list[str] | None = None,
        port: int = 0,
    ) -> None:
        self.n = n
        self.port = port  # the first worker's port (0: ephemeral), e.g. a restarted worker's old one
        self.config = config or SimConfig()
        self.roles = roles
        self.host = host
        self.ready_timeout = ready_timeout
        self.stop_timeout = stop_timeout
        self.python = python
        self.extra_args = extra_args or []
        self.urls: list[str] = []
        self.bootstrap_ports: list[int | None] = []
        self.counters: dict[str, Any] | None = None
        self.returncode: int | None = None
        self.proc: subprocess.Popen[str] | None = None
        self._ready = threading.Event()
        self._lines: list[str] = []
        self._reader: threading.Thread | None = None
        self._stderr = tempfile.TemporaryFile(mode="w+")

    def argv(self) -> list[str]:
        args = [self.python, "-m", "gateway", "sim-worker", "--num-workers", str(self.n)]
        args += ["--host", self.host, "--port", str(self.port), *config_to_argv(self.config)]
        if self.roles:
            args += ["--roles", *self.roles]
        return args + self.extra_args

    # ---------------------------------------------------------------- sync API
    def start(self) -> SubprocessFleet:
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        self.proc = subprocess.Popen(
            self.argv(), stdout=subprocess.PIPE, stderr=self._stderr, text=True, env=env
        )
        self._reader = threading.Thread(target=self._read_stdout, daemon=True)
        self._reader.start()
        try:
            if not self._ready.wait(self.ready_timeout) or not self.urls:
                raise RuntimeError(
                    f"sim-worker fleet not ready after {self.ready_timeout}s"
                    f" (exit code {self.proc.poll()}): {self.stderr_text()[-2000:]}"
                )
        except BaseException:
            self.kill()
            raise
        return self

    def stop(self) -> dict[str, Any] | None:
        """SIGTERM, wait for the counters line and the exit; kill if it lingers."""
        proc = self.proc
        if proc is None:
            return self.counters
        try:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(self.stop_timeout)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(5)
        finally:
            self.kill()
        return self.counters

    def kill(self) -> None:
        """Make sure the child is gone (idempotent)."""
        proc = self.proc
        if proc is None:
            return
        if proc.poll() is None:
            proc.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(5)
        self.returncode = proc.returncode
        if self._reader is not None:
            self._reader.join(5)
        self._ready.set()

    def stderr_text(self) -> str:
        self._stderr.flush()
        self._stderr.seek(0)
        return self._stderr.read()

    @property
    def stdout_lines(self) -> list[str]:
        return list(self._lines)

    def _read_stdout(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        for line in self.proc.stdout:
            self._lines.append(line)
            try:
                msg = json.loads(line)
            except ValueError:
                continue
            if not isinstance(msg, dict):
                continue
            if msg.get("event") == "ready":
                self.urls = list(msg["urls"])
                self.bootstrap_ports = list(msg.get("bootstrap_ports", []))
                self._ready.set()
            elif msg.get("event") == "counters":
                self.counters = msg
        self._ready.set()

    def __enter__(self) -> SubprocessFleet:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ---------------------------------------------------------------- async API
    async def __aenter__(self) -> SubprocessFleet:
        try:
            return await asyncio.to_thread(self.start)
        except BaseException:
            self.kill()
            raise

    async def __aexit__(self, *exc: object) -> None:
        try:
            await asyncio.to_thread(self.stop)
        finally:
            self.kill()


class WorkerProcesses:
    """One ``SubprocessFleet`` of one worker per config: a kill is a real SIGKILL of that
    worker alone (streams break mid-token), and a restart brings it back on its port."""

    def __init__(self, configs: Sequence[SimConfig], *, extra_args: Sequence[str] = (), ready_timeout: float = 60.0) -> None:
        if not configs:
            raise ValueError("WorkerProcesses needs at least one worker config")
        self.configs = list(configs)
        self.extra_args = list(extra_args)
        self.ready_timeout = ready_timeout
        self.procs: list[SubprocessFleet | None] = [None] * len(self.configs)
        self.ports = [0] * len(self.configs)

    @property
    def urls(self) -> list[str]:
        return [f"grpc://127.0.0.1:{port}" for port in self.ports]

    @property
    def pids(self) -> list[int]:
        """The running workers' process ids."""
        return [p.proc.pid for p in self.procs if p is not None and p.proc is not None]

    def start(self) -> WorkerProcesses:
        """Start every worker not running (each on its old port once it has had one)."""
        try:
            for i, proc in enumerate(self.procs):
                if proc is None:
                    self.restart(i)
        except BaseException:
            self.kill_all()
            raise
        return self

    def restart(self, i: int) -> None:
        """Start worker ``i`` (on its old port after a kill); it must not be running."""
        if self.procs[i] is not None:
            raise RuntimeError(f"worker {i} is running: kill it before a restart")
        child = SubprocessFleet(
            1, self.configs[i], extra_args=self.extra_args, port=self.ports[i], ready_timeout=self.ready_timeout
        )
        self.procs[i] = child.start()
        self.ports[i] = int(child.urls[0].rsplit(":", 1)[1])

    def kill(self, i: int) -> None:
        """SIGKILL worker ``i``: no grace, as a crash."""
        proc, self.procs[i] = self.procs[i], None
        if proc is not None:
            proc.kill()

    def stop(self) -> None:
        """SIGTERM every running worker (each is killed if it lingers)."""
        for i, proc in enumerate(self.procs):
            if proc is not None:
                self.procs[i] = None
                proc.stop()

    def kill_all(self) -> None:
        for i in range(len(self.procs)):
            self.kill(i)

    async def __aenter__(self) -> WorkerProcesses:
        try:
            return await asyncio.to_thread(self.start)
        except BaseException:
            self.kill_all()
            raise

    async def __aexit__(self, *exc: object) -> None:
        try:
            await asyncio.to_thread(self.stop)
        finally:
            self.kill_all()
