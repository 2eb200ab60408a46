"""The gateway a soak drives: in the soak's own process, or a ``token-gateway serve`` child.

In-process is quick to start and lets the soak read every counter directly, but its
RSS is the sum of the gateway, the simulated workers (their KV radix caches) and the
client. The child process runs the very same settings and is measured alone: its
RSS comes from ``/proc/PID/status``, its counters from its own ``/metrics`` and
``GET /workers``, and with ``heap_dir`` it traces its Python heap and dumps
snapshots on SIGUSR2 (``gateway.observability.heap_trace``).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
import tracemalloc
from pathlib import Path
from typing import Any, Protocol

import httpx
from prometheus_client.parser import text_string_to_metric_families

from gateway.observability.heap_trace import ENV_VAR, snapshot_path
from gateway.server.config import GatewayConfig, ServerConfig
from gateway_lab.bench import launch

# Gauges that must read zero once traffic stops (per worker, or process-wide).
IDLE_GAUGES = (
    "token_gateway_worker_in_flight",
    "token_gateway_worker_queued_prefill_tokens",
    "token_gateway_worker_running_decode_tokens",
    "token_gateway_http_requests_in_flight",
    "token_gateway_queue_depth",
)
SELF_COUNTED = "token_gateway_http_requests_in_flight"  # the /metrics scrape reading it is one of them
BACKOFF_BASE_S = 0.005  # retries should not dominate the soak's wall time


def rss_mb(pid: int | str = "self") -> float:
    """Resident set size of a process in MB (Linux /proc; 0 elsewhere or once it is gone)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


class SoakGateway(Protocol):
    url: str
    model: str
    pid: int

    def rss_mb(self) -> float: ...

    def traced_mb(self) -> float | None: ...

    async def leftover(self) -> dict[str, Any]: ...

    async def close(self) -> None: ...


class InProcessGateway:
    """The gateway served on this event loop (``bench.inprocess``; the soak's original set-up)."""

    def __init__(self, served: Any, stack: contextlib.AsyncExitStack) -> None:
        self.state, self.url, self._stack = served.state, served.url, stack
        self.model = self.state.catalog.names()[0]
        self.pid = os.getpid()

    @classmethod
    async def start(
        cls, worker_urls: list[str], policy: str, first_token_timeout_s: float, stall_timeout_s: float, tmp_dir: Path
    ) -> InProcessGateway:
        from gateway_lab.bench.inprocess import serve_in_process

        gw = GatewayConfig(server=ServerConfig(worker_urls=worker_urls, tokenizer_cache_dir=str(tmp_dir / "tok"), access_log=False))
        gw.policy.policy = policy
        gw.retry.backoff_base_s = BACKOFF_BASE_S
        gw.dispatch.first_token_timeout_s = first_token_timeout_s
        gw.dispatch.stall_timeout_s = stall_timeout_s
        stack = contextlib.AsyncExitStack()
        served = await stack.enter_async_context(serve_in_process(gw))
        return cls(served, stack)

    def rss_mb(self) -> float:
        return rss_mb()

    def traced_mb(self) -> float | None:
        return tracemalloc.get_traced_memory()[0] / 2**20 if tracemalloc.is_tracing() else None

    async def leftover(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for w in self.state.registry.all():
            load = w.load
            if load.in_flight or load.queued_prefill_tokens or load.running_decode_tokens:
                out[f"gateway:{w.id}"] = {
                    "in_flight": load.in_flight, "queued_prefill_tokens": load.queued_prefill_tokens,
                    "running_decode_tokens": load.running_decode_tokens,
                }
        http_in_flight = self.state.metrics.in_flight._value.get()
        if http_in_flight:
            out["gateway:http_in_flight"] = http_in_flight
        return out

    async def close(self) -> None:
        await self._stack.aclose()


class GatewayProcess:
    """``python -m gateway serve`` with the soak's settings (started by the launcher),
    measured from outside."""

    def __init__(self, gateway: launch.Gateway, stack: contextlib.AsyncExitStack, heap_dir: Path | None) -> None:
        self.url = gateway.url
        models = gateway.ready_info.get("models") or []
        self.model = str(models[0]) if models else ""
        self.pid = gateway.pid
        self.heap_dir = heap_dir
        self.snapshots: list[Path] = []  # written, in order
        self._stack = stack  # owns the process: closing it stops the gateway
        self._signalled = 0
        self._http = httpx.AsyncClient(base_url=self.url, timeout=10.0, trust_env=False)

    @classmethod
    async def start(
        cls, worker_urls: list[str], policy: str, first_token_timeout_s: float, stall_timeout_s: float,
        tmp_dir: Path, heap_dir: Path | None = None,
    ) -> GatewayProcess:
        args = [
            "--tokenizer-cache-dir", str(tmp_dir / "tok"), "--no-access-log", "--log-level", "warning",
            "--backoff-base-s", str(BACKOFF_BASE_S),
            "--first-token-timeout-s", str(first_token_timeout_s), "--stall-timeout-s", str(stall_timeout_s),
        ]  # fmt: skip
        env = {**os.environ, ENV_VAR: str(heap_dir)} if heap_dir is not None else None  # the child traces its heap
        stack = contextlib.AsyncExitStack()
        try:
            gateway = await stack.enter_async_context(
                launch.gateway("ours", worker_urls, policy, extra_args=args, env=env, log_dir=tmp_dir)
            )
        except BaseException:
            await stack.aclose()
            raise
        return cls(gateway, stack, heap_dir)

    def rss_mb(self) -> float:
        return rss_mb(self.pid)

    def traced_mb(self) -> float | None:
        return None  # the child's heap is read from its snapshots instead

    async def snapshot(self, timeout_s: float = 60.0) -> Path | None:
        """Ask the child for a heap snapshot (SIGUSR2) and wait until it is written."""
        if self.heap_dir is None:
            return None
        self._signalled += 1
        path = snapshot_path(self.heap_dir, self._signalled)
        os.kill(self.pid, signal.SIGUSR2)
        deadline = time.monotonic() + timeout_s
        while not path.exists():
            if time.monotonic() > deadline or not _running(self.pid):
                return None
            await asyncio.sleep(0.1)
        self.snapshots.append(path)
        return path

    async def leftover(self) -> dict[str, Any]:
        """Non-zero in-flight gauges from ``/metrics`` and per-worker loads from ``GET /workers``."""
        out: dict[str, Any] = {}
        for name, worker, value in await self._idle_samples():
            if value:
                out[f"metrics:{name}{'{' + worker + '}' if worker else ''}"] = value
        for w in (await self._http.get("/workers")).json()["workers"]:
            busy = {k: w[k] for k in ("in_flight", "queued_prefill_tokens", "running_decode_tokens") if w.get(k)}
            if busy:
                out[f"workers:{w['id']}"] = busy
        return out

    async def idle_gauges(self) -> dict[str, float]:
        """Every idle gauge's total as the child reports it (for the record, zeros included)."""
        totals = dict.fromkeys(IDLE_GAUGES, 0.0)
        for name, _, value in await self._idle_samples():
            totals[name] += value
        return totals

    async def _idle_samples(self) -> list[tuple[str, str, float]]:
        """(gauge, worker label, value) of each idle gauge, not counting the scrape itself."""
        out = []
        for family in text_string_to_metric_families((await self._http.get("/metrics")).text):
            for sample in family.samples:
                if sample.name in IDLE_GAUGES:
                    value = sample.value - (1 if sample.name == SELF_COUNTED else 0)
                    out.append((sample.name, sample.labels.get("worker", ""), value))
        return out

    async def close(self) -> None:
        with contextlib.suppress(Exception):
            await self._http.aclose()
        await self._stack.aclose()


def _running(pid: int) -> bool:
    """Whether ``pid`` is alive (an exited child not yet reaped is a zombie: not running)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"
