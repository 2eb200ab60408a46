"""``serve --processes N``: a supervisor and N serving processes sharing the ports.

The supervisor owns what the set shares: the HTTP and gRPC ports (resolved once, even
for port 0, and held; each child listens on them with SO_REUSEPORT, so the kernel
spreads connections over the children), the NATS sync bus (``--sync-url``, else a nats-server it runs on
loopback), and a private run folder (the config, ``set.json`` for ``/health``, the
children's metrics sockets). Each child is a whole gateway (parse, render, tokenize,
route, relay) started as ``python -m gateway.server.serve`` (its ``child_main``), pinned
to its own share of the CPUs by default (``--process-cpu-affinity``).

A child that dies is restarted (its own clients see their connections end; the others'
are untouched, and new connections go to the survivors until it is back). SIGTERM is passed to every child, each drains with ``--shutdown-grace-s``;
a second signal is passed on too (children then force their exit). One ready line is
printed once every child is ready.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import logging
import math
import os
import pickle
import shutil
import signal
import socket
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson

from gateway.server.admission import AdmissionConfig
from gateway.server.config import GatewayConfig
from gateway.server.parking import CoreSample, Parking
from gateway.server.process_set import ENV_COUNT, ENV_INDEX, ENV_RUN_DIR, STATUS_FILE, write_parking
from gateway.sync.local_server import LocalNatsServer, die_with_parent, free_port

log = logging.getLogger("gateway")

CONFIG_FILE = "config.pickle"
START_TIMEOUT_S = 180.0  # a child loads tokenizers and probes workers before it is ready
RESTART_MIN_S = 0.5  # a child that keeps dying is restarted at most this often (doubling to RESTART_MAX_S)
RESTART_MAX_S = 10.0
PARK_SAMPLE_S = 1.0  # seconds between two readings of the host's and the set's CPU (server.parking)


def share_admission(cfg: AdmissionConfig, index: int, count: int) -> AdmissionConfig:
    """Process ``index`` of ``count``'s part of the set's limits (the rule --help states)."""

    def split(total: int, floor: int) -> int:
        part = total // count + (1 if index < total % count else 0)
        return max(floor, part)

    return dataclasses.replace(
        cfg,
        max_concurrent_requests=split(cfg.max_concurrent_requests, 1) if cfg.max_concurrent_requests > 0 else 0,
        max_queued_requests=split(cfg.max_queued_requests, 0),
        rate_limit_per_s=cfg.rate_limit_per_s / count,
        rate_limit_burst=math.ceil(cfg.rate_limit_burst / count) if cfg.rate_limit_burst > 0 else 0,
    )


def active_admission(cfg: AdmissionConfig, index: int, count: int, active: list[int]) -> AdmissionConfig:
    """Process ``index``'s part of the set's limits while only ``active`` take connections: the
    active ones split the whole set's limits among themselves (a parked set admits what the
    whole set would); a parked one keeps its own share for the requests it still serves."""
    live = [i for i in active if 0 <= i < count]
    if index in live:
        return share_admission(cfg, live.index(index), len(live))
    return share_admission(cfg, index, count)


@dataclasses.dataclass
class Child:
    index: int
    proc: asyncio.subprocess.Process | None = None
    ready: dict[str, Any] | None = None
    restarts: int = 0
    started_at: float = 0.0
    backoff: float = RESTART_MIN_S


def host_busy_s() -> float | None:
    """CPU seconds every core of the host has been busy (/proc/stat), or None off Linux."""
    try:
        fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    except (OSError, ValueError):
        return None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def process_cpu_s(pid: int) -> float | None:
    """User + system CPU seconds of process ``pid`` (all its threads), or None when gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return None


def active_shares(shares: list[set[int]], active: list[int]) -> list[set[int]]:
    """Each process's CPUs while only ``active`` take connections: an active process keeps
    its own share and takes the shares of parked ones (dealt round the active ones in
    turn); a parked one keeps its own.

    Why: the pins give each busy process a core of its own; a parked set serves as fewer
    processes, and an active one still held to its own share could not use the core its
    parked sibling leaves to it (one process of its own is not pinned at all)."""
    out = [set(s) for s in shares]
    live = [i for i in active if 0 <= i < len(shares)]
    if not live:
        return out
    parked = [i for i in range(len(shares)) if i not in live]
    for turn, i in enumerate(parked):
        out[live[turn % len(live)]] |= shares[i]
    return out


def set_process_affinity(pid: int, cpus: set[int]) -> bool:
    """Pin every thread of process ``pid`` to ``cpus`` (a thread's affinity is its own: the
    process's id names its first thread only); False when the process is gone."""
    try:
        tasks = [int(t.name) for t in Path(f"/proc/{pid}/task").iterdir()]
    except OSError:
        tasks = [pid]
    done = False
    for tid in tasks:
        with contextlib.suppress(OSError):  # a thread that ended meanwhile
            os.sched_setaffinity(tid, cpus)
            done = True
    return done


def _pinned_child(cpus: set[int]) -> None:
    """preexec_fn of a pinned child: before exec, so every thread it starts inherits the set."""
    die_with_parent()
    with contextlib.suppress(OSError):
        os.sched_setaffinity(0, cpus)


class Supervisor:
    def __init__(self, config: GatewayConfig, count: int) -> None:
        self.config = config
        self.count = count
        self.children = [Child(i) for i in range(count)]
        self.cpu_shares = config.processes.cpu_shares(count)  # child i's CPUs (None: not pinned)
        self.stopping = False
        self._signals = 0
        self.nats: LocalNatsServer | None = None
        self.run_dir = Path(tempfile.mkdtemp(prefix="token-gateway-"))
        self.http_sock: socket.socket | None = None
        self.grpc_reserve: socket.socket | None = None
        self._done = asyncio.Event()
        self.active = list(range(count))  # the processes that take connections (server.parking)
        parks = config.processes.process_parking == "auto" and count > 1 and not config.tls.enabled
        self.parking = Parking(count, os.cpu_count() or 1, active=1) if parks and host_busy_s() is not None else None
        if self.parking is not None:  # one process to start with; the others as cores are found for them
            self.active = list(range(self.parking.active))
            write_parking(self.run_dir, self.active)

    # ------------------------------------------------------------ shared resources
    def _bind(self) -> GatewayConfig:
        cfg = self.config
        host = cfg.server.host
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        # Reserve each port (bound with SO_REUSEPORT, never listening: the kernel hands
        # connections to listening sockets only) so it stays ours, port 0 included, while
        # every child binds a listening socket of its own to it. The kernel then spreads
        # connections over the children by their addresses; one shared socket would not:
        # the child whose loop wakes first accepts a whole burst of keep-alive connections.
        http = socket.socket(family)
        http.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        http.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        http.bind((host, cfg.server.port))
        self.http_sock = http
        server = dataclasses.replace(cfg.server, port=http.getsockname()[1])
        if cfg.server.grpc_port is not None:
            res = socket.socket(family)
            res.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            res.bind((host, cfg.server.grpc_port))
            self.grpc_reserve = res
            server = dataclasses.replace(server, grpc_port=res.getsockname()[1])
        metrics_port = cfg.metrics_port
        if metrics_port.prometheus_port == 0:  # process 0 serves it: resolve the port once, for restarts too
            metrics_port = dataclasses.replace(metrics_port, prometheus_port=free_port(metrics_port.prometheus_host or host))
        return dataclasses.replace(cfg, server=server, metrics_port=metrics_port)

    async def _sync(self, cfg: GatewayConfig) -> GatewayConfig:
        if cfg.sync.sync_url:
            return cfg
        self.nats = await LocalNatsServer(cfg.processes.nats_server).start()
        url = self.nats.url
        log.info("routing sync: started nats-server at %s for %d processes", url, self.count)
        return dataclasses.replace(cfg, sync=dataclasses.replace(cfg.sync, sync_url=url))

    # ------------------------------------------------------------ children
    def _write_status(self) -> None:
        alive = [c for c in self.children if c.proc is not None and c.proc.returncode is None and c.ready is not None]
        status = {
            "expected": self.count,
            "alive": len(alive),
            "restarts": sum(c.restarts for c in self.children),
            "pids": [c.proc.pid if c.proc is not None and c.proc.returncode is None else None for c in self.children],
            "cpus": None if self.cpu_shares is None else [sorted(s) for s in active_shares(self.cpu_shares, self.active)],
            "active": self.active,
            "stopping": self.stopping,
        }
        tmp = self.run_dir / (STATUS_FILE + ".tmp")
        tmp.write_bytes(orjson.dumps(status))
        tmp.replace(self.run_dir / STATUS_FILE)

    async def _spawn(self, child: Child) -> None:
        env = {**os.environ, ENV_INDEX: str(child.index), ENV_COUNT: str(self.count), ENV_RUN_DIR: str(self.run_dir)}
        # Each process is one core's worth of work: N processes each running a tokenizer thread
        # pool as wide as the host only fight each other for the cores (unless asked for).
        env.setdefault("TOKENIZERS_PARALLELISM", "false")
        child.ready = None
        child.started_at = time.monotonic()
        child.proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "gateway.server.serve",
            env=env, stdout=asyncio.subprocess.PIPE,
            stdin=asyncio.subprocess.DEVNULL,
            # Own session: a terminal's Ctrl-C reaches the supervisor only, which passes one SIGTERM on.
            start_new_session=True,
            preexec_fn=die_with_parent if self.cpu_shares is None else functools.partial(_pinned_child, self._cpus(child.index)),
        )

    async def _await_ready(self, child: Child) -> None:
        proc = child.proc
        assert proc is not None and proc.stdout is not None
        async with asyncio.timeout(START_TIMEOUT_S):
            while True:
                line = await proc.stdout.readline()
                if not line:
                    raise RuntimeError(f"serving process {child.index} exited before it was ready (code {await proc.wait()})")
                with contextlib.suppress(orjson.JSONDecodeError):
                    msg = orjson.loads(line)
                    if isinstance(msg, dict) and msg.get("event") == "ready":
                        child.ready = msg
                        return
                sys.stdout.buffer.write(line)

    async def _drain_stdout(self, child: Child) -> None:
        proc = child.proc
        assert proc is not None and proc.stdout is not None
        while line := await proc.stdout.readline():
            sys.stdout.buffer.write(line)
            sys.stdout.flush()

    async def _watch(self, child: Child) -> None:
        """Keep one slot of the set alive until shutdown."""
        while True:
            proc = child.proc
            assert proc is not None
            drain = asyncio.create_task(self._drain_stdout(child))
            code = await proc.wait()
            await drain
            self._write_status()
            if self.stopping:
                return
            lived = time.monotonic() - child.started_at
            child.backoff = RESTART_MIN_S if lived > 30 else min(child.backoff * 2, RESTART_MAX_S)
            log.warning("serving process %d (pid %d) exited with code %s; restarting it in %.1f s",
                        child.index, proc.pid, code, child.backoff)
            await asyncio.sleep(child.backoff)
            if self.stopping:
                return
            child.restarts += 1
            try:
                await self._spawn(child)
                await self._await_ready(child)
            except (RuntimeError, TimeoutError) as exc:
                log.error("serving process %d did not come back: %s", child.index, exc)
                if child.proc is not None and child.proc.returncode is None:
                    child.proc.kill()
                continue
            self._write_status()
            log.info("serving process %d is back (pid %d)", child.index, child.proc.pid if child.proc else -1)

    # ------------------------------------------------------------ parking
    def _reading(self) -> tuple[float, float, dict[int, float]] | None:
        host = host_busy_s()
        if host is None:
            return None
        cpu = {}
        for c in self.children:
            if c.proc is not None and c.proc.returncode is None and (t := process_cpu_s(c.proc.pid)) is not None:
                cpu[c.proc.pid] = t
        return time.monotonic(), host, cpu

    async def _watch_cores(self, parking: Parking) -> None:
        """Once a second: the host's and the set's CPU into the parking rule; a change is
        written for the children (``parking.json``) and signalled to those that are ready."""
        before = self._reading()
        while True:
            await asyncio.sleep(PARK_SAMPLE_S)
            now = self._reading()
            if before is not None and now is not None:
                own = sum(t - before[2][pid] for pid, t in now[2].items() if pid in before[2])  # a restarted child: next time
                active = parking.update(CoreSample(now[0] - before[0], now[1] - before[1], own))
                if active != len(self.active):
                    self._set_active(active)
            before = now

    def _cpus(self, index: int) -> set[int]:
        """Process ``index``'s CPUs now (pinned sets only): its share, and parked siblings' while it is active."""
        assert self.cpu_shares is not None
        return active_shares(self.cpu_shares, self.active)[index]

    def _set_active(self, count: int) -> None:
        self.active = list(range(count))
        write_parking(self.run_dir, self.active)
        for c in self.children:
            if c.proc is not None and c.proc.returncode is None:
                if self.cpu_shares is not None:
                    set_process_affinity(c.proc.pid, self._cpus(c.index))
                if c.ready is not None:
                    with contextlib.suppress(ProcessLookupError):
                        c.proc.send_signal(signal.SIGUSR1)
        self._write_status()
        log.info("parking: %d of %d serving processes take connections (%s)", count, self.count,
                 "no spare core" if count < self.count else "a core is spare again")

    def _signal(self) -> None:
        self._signals += 1
        if not self.stopping:
            self.stopping = True
            log.info("shutting down %d serving processes (grace %.0f s)", self.count, self.config.server.shutdown_grace_s)
        for c in self.children:  # a second signal is passed on too: the children force their exit
            if c.proc is not None and c.proc.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    c.proc.send_signal(signal.SIGTERM)
        self._done.set()

    # ------------------------------------------------------------ the whole run
    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._signal)
        watchers: list[asyncio.Task[None]] = []
        try:
            cfg = await self._sync(self._bind())
            (self.run_dir / CONFIG_FILE).write_bytes(pickle.dumps(cfg))
            for child in self.children:
                await self._spawn(child)
            try:
                await asyncio.gather(*(self._await_ready(c) for c in self.children))
            except (RuntimeError, TimeoutError) as exc:
                log.error("%s", exc)
                self._signal()
                await self._reap(grace=5.0)
                return 1
            self._write_status()
            first = self.children[0].ready or {}
            ready = {**first, "processes": self.count, "pids": [c.proc.pid for c in self.children if c.proc],
                     "sync_url": cfg.sync.sync_url}
            print(orjson.dumps(ready).decode(), flush=True)
            watchers = [asyncio.create_task(self._watch(c)) for c in self.children]
            if self.parking is not None:
                watchers.append(asyncio.create_task(self._watch_cores(self.parking)))
            await self._done.wait()
            await self._reap(grace=self.config.server.shutdown_grace_s + 15.0)
            return 0
        finally:
            self.stopping = True
            for w in watchers:
                w.cancel()
            for c in self.children:
                if c.proc is not None and c.proc.returncode is None:
                    c.proc.kill()
                    with contextlib.suppress(Exception):
                        await c.proc.wait()
            if self.nats is not None:
                await self.nats.stop()
            for s in (self.http_sock, self.grpc_reserve):
                if s is not None:
                    s.close()
            shutil.rmtree(self.run_dir, ignore_errors=True)

    async def _reap(self, grace: float) -> None:
        """Wait for every child to finish its drain (bounded), then kill the stragglers."""
        procs = [c.proc for c in self.children if c.proc is not None and c.proc.returncode is None]
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(grace):
                await asyncio.gather(*(p.wait() for p in procs))
        for p in procs:
            if p.returncode is None:
                log.warning("serving process pid %d did not drain in time; killing it", p.pid)
                p.kill()


def run_set(config: GatewayConfig, count: int) -> int:
    try:
        return asyncio.run(Supervisor(config, count).run())
    except RuntimeError as exc:
        log.error("%s", exc)
        return 1
