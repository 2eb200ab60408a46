"""Soak: thousands of mixed requests through a real gateway while workers misbehave.

Everything runs in one process and one event loop: simulated workers on
loopback, the gateway (uvicorn) in front of them, and an httpx client that
sends a shuffled mix of chat / completions / generate, streaming and not,
``n`` > 1, stop strings, while a chaos task flips worker faults on and off
(mid-stream failures, refusals, stalls) and some clients hang up early.

What it checks at the end, and reports:
- every request either succeeded, got a clean error (OpenAI error JSON, or an
  error event then ``[DONE]`` in a stream), or was one the client dropped;
- every in-flight counter is back to zero: the gateway's load guards, its HTTP
  in-flight gauge, and each simulated worker's running/waiting queues;
- memory is flat after warm-up (RSS, and traced Python memory if asked).

Used by ``tests/e2e/test_soak.py`` (bounded) and ``token-gateway bench soak`` (figures).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import random
import statistics
import time
import tracemalloc
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx
import orjson

from gateway_lab.bench import launch
from gateway_lab.bench.soak_targets import GatewayProcess, InProcessGateway, SoakGateway, rss_mb
from gateway_lab.sim.config import SimConfig
from gateway_lab.sim.fleet import SimFleet

KINDS = ("chat", "chat_stream", "completion", "completion_stream", "generate", "generate_stream")
FAULTS = ("fail_mid_stream", "reject", "stall")
SYSTEMS = [f"You are assistant number {i}. " + "Answer briefly and precisely. " * (10 + 5 * i) for i in range(4)]


@dataclass
class SoakConfig:
    requests: int = 2000
    concurrency: int = 32
    workers: int = 3
    seed: int = 0
    disconnect_rate: float = 0.05  # share of requests whose client hangs up early
    fault_period_s: float = 0.5  # how often the chaos task changes one worker's fault
    fault_rate: float = 0.5  # chance a chaos tick turns a fault on (else clears one)
    max_seconds: float = 600.0  # hard bound on the whole run
    request_deadline_s: float = 90.0  # backstop per request, client side (httpx's own timeouts are 30 s)
    policy: str = "cache_aware"
    first_token_timeout_s: float = 2.0  # the gateway's; a stall fault lasts longer than both
    stall_timeout_s: float = 1.0
    trace_memory: bool = False  # tracemalloc (slower; measures Python heap precisely)
    # Run the gateway as its own `token-gateway serve` process, so its RSS is measured alone
    # (the simulated workers, the chaos and the client stay in this process).
    gateway_process: bool = False
    heap_top: int = 15  # with gateway_process and trace_memory: lines of the heap-growth diff kept
    memory_samples: int = 20
    sim: dict[str, Any] = field(default_factory=lambda: {
        "step_base_s": 0.0005, "prefill_token_s": 0.0, "decode_seq_s": 0.00002, "time_scale": 1.0,
    })


@dataclass
class SoakReport:
    config: dict[str, Any]
    seconds: float = 0.0
    outcomes: dict[str, int] = field(default_factory=dict)  # ok / clean_error / disconnected / unclean
    by_kind: dict[str, dict[str, int]] = field(default_factory=dict)
    statuses: dict[str, int] = field(default_factory=dict)
    unclean_examples: list[str] = field(default_factory=list)
    latency_p50_ms: float = 0.0
    latency_p99_ms: float = 0.0
    fault_flips: dict[str, int] = field(default_factory=dict)
    leftover: dict[str, Any] = field(default_factory=dict)  # in-flight counters after the run
    rss_mb: list[float] = field(default_factory=list)  # the gateway's, sampled after warm-up, one per slice
    rss_of: str = ""  # which process rss_mb measures
    soak_rss_mb: list[float] = field(default_factory=list)  # this process's, when the gateway runs apart
    idle_gauges: dict[str, float] = field(default_factory=dict)  # the child's in-flight gauges at the end
    heap_growth: list[str] = field(default_factory=list)  # tracemalloc diff in the child, mid-run -> end
    heap_traced_mb: list[float] = field(default_factory=list)  # the child's traced heap at each snapshot
    traced_mb: list[float] = field(default_factory=list)
    completed: int = 0

    @property
    def requests_per_s(self) -> float:
        return self.completed / self.seconds if self.seconds else 0.0

    @property
    def all_clean(self) -> bool:
        return self.outcomes.get("unclean", 0) == 0

    @property
    def idle(self) -> bool:
        return not any(self.leftover.values())

    def growth(self, series: list[float]) -> float:
        """MB gained from the first to the last third of ``series`` (means, to smooth noise)."""
        if len(series) < 3:
            return 0.0
        k = max(1, len(series) // 3)
        return statistics.fmean(series[-k:]) - statistics.fmean(series[:k])

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out.update(
            requests_per_s=round(self.requests_per_s, 1),
            rss_growth_mb=round(self.growth(self.rss_mb), 2),
            traced_growth_mb=round(self.growth(self.traced_mb), 2),
            all_clean=self.all_clean,
            idle=self.idle,
        )
        return out


# ---------------------------------------------------------------- requests
@dataclass
class _Spec:
    kind: str
    path: str
    body: dict[str, Any]
    stream: bool
    disconnect_after_s: float | None


def _spec(rng: random.Random, model: str, disconnect_rate: float) -> _Spec:
    kind = rng.choice(KINDS)
    stream = kind.endswith("_stream")
    system = rng.choice(SYSTEMS)
    question = f"Question {rng.randrange(10_000)}: what is {rng.randrange(100)} plus {rng.randrange(100)}?"
    max_tokens = rng.randint(4, 48)
    n = rng.choice((1, 1, 1, 2))
    stop = rng.choice((None, None, ["."], [" the", "\n\n"]))
    if kind.startswith("chat"):
        body: dict[str, Any] = {
            "model": model, "max_tokens": max_tokens, "n": n, "stream": stream,
            "messages": [{"role": "system", "content": system}, {"role": "user", "content": question}],
            "chat_template_kwargs": {"enable_thinking": False},
        }
        path = "/v1/chat/completions"
    elif kind.startswith("completion"):
        body = {"model": model, "prompt": system + question, "max_tokens": max_tokens, "n": n, "stream": stream}
        path = "/v1/completions"
    else:
        params: dict[str, Any] = {"max_new_tokens": max_tokens, "n": n}
        if stop:
            params["stop"] = stop
        body = {"text": system + question, "sampling_params": params, "stream": stream}
        path = "/generate"
    if stop and not kind.startswith("generate"):
        body["stop"] = stop
    if stream and rng.random() < 0.5:
        body["stream_options"] = {"include_usage": True} if not kind.startswith("generate") else None
        if body["stream_options"] is None:
            del body["stream_options"]
    hang_up = rng.uniform(0.0, 0.05) if rng.random() < disconnect_rate else None
    return _Spec(kind, path, body, stream, hang_up)


def _json(body: bytes) -> Any:
    """A body as JSON, or None when it is not (a proxy's HTML page, a plain-text 431)."""
    try:
        return orjson.loads(body) if body else None
    except orjson.JSONDecodeError:
        return None


def _is_error_body(data: Any) -> bool:
    err = data.get("error") if isinstance(data, dict) else None
    return isinstance(err, dict) and bool(err.get("message")) and bool(err.get("type"))


async def _send(http: httpx.AsyncClient, spec: _Spec) -> tuple[str, str]:
    """(outcome, status or detail) of one request."""
    if not spec.stream:
        r = await http.post(spec.path, json=spec.body)
        data = _json(r.content)
        if r.status_code == 200:
            ok = isinstance(data, (dict, list)) and not _is_error_body(data)
            return ("ok" if ok else "unclean"), "200"
        return ("clean_error" if _is_error_body(data) else "unclean"), str(r.status_code)
    async with http.stream("POST", spec.path, json=spec.body) as r:
        if r.status_code != 200:
            body = await r.aread()
            clean = _is_error_body(_json(body))
            return ("clean_error" if clean else "unclean"), str(r.status_code)
        saw_error = saw_done = False
        events = 0
        try:
            async for line in r.aiter_lines():
                if not line.startswith("data: "):
                    continue
                payload = line[6:]
                if payload == "[DONE]":
                    saw_done = True
                    break
                events += 1
                if _is_error_body(_json(payload.encode())):
                    saw_error = True
        except httpx.TransportError as exc:
            return "unclean", f"{type(exc).__name__} after 200 and {events} events (error event seen: {saw_error})"
        if not saw_done:
            return "unclean", "stream ended without [DONE]"
        if saw_error:
            return "clean_error", "stream error event"
        return ("ok" if events else "unclean"), "200"


async def _send_alone(shared: httpx.AsyncClient, spec: _Spec) -> tuple[str, str]:
    """``_send`` on a connection of its own, closed when the request ends or is cancelled.

    A client that hangs up is cancelled mid-request. Cancelling requests on a shared
    httpx pool can strand its connection slots (httpcore 1.0.x, encode/httpcore#830,
    #1093): after tens of thousands of requests a soak's client tasks all waited on the pool
    forever while the gateway sat idle. A hung-up client owning its connection is also
    what a real one looks like to the gateway.
    """
    async with httpx.AsyncClient(base_url=shared.base_url, timeout=shared.timeout, trust_env=False) as own:
        return await _send(own, spec)


async def _one(http: httpx.AsyncClient, spec: _Spec) -> tuple[str, str]:
    if spec.disconnect_after_s is None:
        return await _send(http, spec)
    task = asyncio.ensure_future(_send_alone(http, spec))
    done, _ = await asyncio.wait({task}, timeout=spec.disconnect_after_s)
    if task in done:
        return task.result()
    task.cancel()  # closes the connection: the gateway sees the client leave
    with contextlib.suppress(BaseException):
        await task
    return "disconnected", "client hung up"


# ---------------------------------------------------------------- chaos
class _Chaos:
    """Flip faults on the simulated workers at random; never on all of them at once."""

    def __init__(self, fleet: SimFleet, rng: random.Random, cfg: SoakConfig) -> None:
        self.fleet = fleet
        self.rng = rng
        self.cfg = cfg
        self.flips: Counter[str] = Counter()
        self.faulty: dict[int, str] = {}

    def _clear(self, i: int) -> None:
        f = self.fleet.workers[i].faults
        f.fail_after_tokens, f.reject_status, f.stall_s = -1, "", 0.0
        self.faulty.pop(i, None)

    def tick(self) -> None:
        n = len(self.fleet.workers)
        if self.faulty and (self.rng.random() >= self.cfg.fault_rate or len(self.faulty) >= n - 1):
            self._clear(self.rng.choice(list(self.faulty)))
            return
        healthy = [i for i in range(n) if i not in self.faulty]
        if len(healthy) <= 1:
            return
        i = self.rng.choice(healthy)
        kind = self.rng.choice(FAULTS)
        f = self.fleet.workers[i].faults
        if kind == "fail_mid_stream":
            f.fail_after_tokens = self.rng.randint(1, 8)
        elif kind == "reject":
            f.reject_status = self.rng.choice(("UNAVAILABLE", "RESOURCE_EXHAUSTED"))
        else:
            f.stall_s = max(self.cfg.first_token_timeout_s, self.cfg.stall_timeout_s) + 0.5
            f.stall_after_tokens = self.rng.randint(0, 4)
        self.faulty[i] = kind
        self.flips[kind] += 1

    def clear_all(self) -> None:
        for i in list(self.faulty):
            self._clear(i)

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.cfg.fault_period_s)
            if not stop.is_set():
                self.tick()


# ---------------------------------------------------------------- the run
def _sim_leftover(fleet: SimFleet) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for sim in fleet.workers:
        busy = sim.scheduler.num_running + sim.scheduler.num_waiting
        if busy or sim._requests:
            out[f"sim:{sim.url}"] = {"running_or_waiting": busy, "tracked_requests": len(sim._requests)}
    return out


async def _wait_idle(gateway: SoakGateway, fleet: SimFleet, timeout_s: float = 5.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while True:
        left = {**await gateway.leftover(), **_sim_leftover(fleet)}
        if not left or time.monotonic() >= deadline:
            return left
        await asyncio.sleep(0.05)


def _short(filename: str) -> str:
    """A frame's file without the machine's install prefix."""
    for marker in ("site-packages/", "src/gateway/", "lib/python3."):
        if marker in filename:
            tail = filename.split(marker, 1)[1]
            return ("gateway/" + tail) if marker == "src/gateway/" else tail
    return filename


def _traced_mb(snapshot: tracemalloc.Snapshot) -> float:
    return sum(s.size for s in snapshot.statistics("filename")) / 2**20


def _heap_diff(first: Path, last: Path, top: int) -> list[str]:
    """Totals, then the call sites whose traced memory grew most, between two heap snapshots."""
    older = tracemalloc.Snapshot.load(str(first))
    newer = tracemalloc.Snapshot.load(str(last))
    lines = [f"traced heap {_traced_mb(older):.2f} MB -> {_traced_mb(newer):.2f} MB ({first.stem} -> {last.stem})"]
    grown = sorted(newer.compare_to(older, "traceback"), key=lambda d: d.size_diff, reverse=True)
    for stat in grown[:top]:
        if stat.size_diff <= 0:
            break
        frames = [f"{_short(f.filename)}:{f.lineno}" for f in reversed(stat.traceback)][:6]
        lines.append(f"{stat.size_diff / 1024:+.1f} KiB ({stat.count_diff:+d} blocks) at " + " <- ".join(frames))
    return lines


async def _start_gateway(cfg: SoakConfig, fleet: SimFleet, tmp_dir: Path) -> SoakGateway:
    args = (fleet.urls, cfg.policy, cfg.first_token_timeout_s, cfg.stall_timeout_s, tmp_dir)
    if cfg.gateway_process:
        return await GatewayProcess.start(*args, heap_dir=tmp_dir / "heap" if cfg.trace_memory else None)
    return await InProcessGateway.start(*args)


async def run_soak(cfg: SoakConfig, tmp_dir: Path) -> SoakReport:
    """Run the soak; the report says whether it was clean, idle and flat."""
    rng = random.Random(cfg.seed)
    report = SoakReport(config=asdict(cfg))
    sim = SimConfig(**cfg.sim)
    if cfg.trace_memory and not cfg.gateway_process:
        tracemalloc.start()
    async with launch.fleet("sim", cfg.workers, sim) as fleet:
        gateway = await _start_gateway(cfg, fleet, tmp_dir)
        child = gateway if isinstance(gateway, GatewayProcess) else None
        report.rss_of = f"gateway process (pid {gateway.pid})" if child else "soak process (gateway + workers + client)"
        model = gateway.model
        chaos = _Chaos(fleet, rng, cfg)
        stop_chaos = asyncio.Event()
        limits = httpx.Limits(max_connections=cfg.concurrency, max_keepalive_connections=cfg.concurrency)
        outcomes: Counter[str] = Counter()
        by_kind: dict[str, Counter[str]] = {k: Counter() for k in KINDS}
        statuses: Counter[str] = Counter()
        latencies: list[float] = []
        specs = [_spec(rng, model, cfg.disconnect_rate) for _ in range(cfg.requests)]
        slice_size = max(1, cfg.requests // max(1, cfg.memory_samples))
        warmup = max(slice_size, cfg.requests // 5)
        next_index = 0
        snapshot_tasks: list[asyncio.Task[Path | None]] = []
        # Heap snapshots in the child: the first (which starts tracing) at the first sample,
        # one halfway through the measured part, one at the end. Mid -> end is the growth
        # that remains once the bounded caches have turned over at least once.
        first_sample = warmup + (-warmup % slice_size)
        snapshot_at = {first_sample, first_sample + slice_size * ((cfg.requests - first_sample) // slice_size // 2)}

        def sample() -> None:
            report.rss_mb.append(round(gateway.rss_mb(), 2))
            if child:
                report.soak_rss_mb.append(round(rss_mb(), 2))
            traced = gateway.traced_mb()
            if traced is not None:
                report.traced_mb.append(round(traced, 3))

        started = time.perf_counter()
        chaos_task = asyncio.create_task(chaos.run(stop_chaos))
        try:
            async with httpx.AsyncClient(base_url=gateway.url, timeout=30, limits=limits, trust_env=False) as http:

                async def worker_loop() -> None:
                    nonlocal next_index
                    while next_index < len(specs) and time.perf_counter() - started < cfg.max_seconds:
                        spec = specs[next_index]
                        next_index += 1
                        t0 = time.perf_counter()
                        try:
                            async with asyncio.timeout(cfg.request_deadline_s):
                                outcome, detail = await _one(http, spec)
                        except TimeoutError:  # must never happen: every wait below has its own timeout
                            outcome, detail = "unclean", f"no answer within {cfg.request_deadline_s:g} s (a hang)"
                        except Exception as exc:  # a transport failure the client did not cause
                            outcome, detail = "unclean", f"{type(exc).__name__}: {exc}"
                        latencies.append(time.perf_counter() - t0)
                        outcomes[outcome] += 1
                        by_kind[spec.kind][outcome] += 1
                        statuses[detail if detail.isdigit() else outcome] += 1
                        if outcome == "unclean" and len(report.unclean_examples) < 10:
                            report.unclean_examples.append(f"{spec.kind} {spec.path}: {detail}")
                        done = sum(outcomes.values())
                        if done >= warmup and done % slice_size == 0:
                            sample()
                            if child and child.heap_dir and done in snapshot_at:
                                snapshot_tasks.append(asyncio.create_task(child.snapshot()))

                await asyncio.gather(*(worker_loop() for _ in range(cfg.concurrency)))
        finally:
            stop_chaos.set()
            await chaos_task
            chaos.clear_all()
        report.seconds = time.perf_counter() - started
        report.leftover = await _wait_idle(gateway, fleet)
        if child:
            report.idle_gauges = await child.idle_gauges()
        gc.collect()
        sample()
        if child and child.heap_dir:
            await asyncio.gather(*snapshot_tasks)
            await child.snapshot()
            shots = child.snapshots
            report.heap_traced_mb = [round(_traced_mb(tracemalloc.Snapshot.load(str(p))), 2) for p in shots]
            if len(shots) >= 2:
                report.heap_growth = _heap_diff(shots[-2], shots[-1], cfg.heap_top)
        if cfg.trace_memory and not child:
            tracemalloc.stop()
        report.completed = sum(outcomes.values())
        report.outcomes = dict(outcomes)
        report.by_kind = {k: dict(v) for k, v in by_kind.items()}
        report.statuses = dict(statuses)
        report.fault_flips = dict(chaos.flips)
        if latencies:
            ordered = sorted(latencies)
            report.latency_p50_ms = round(ordered[len(ordered) // 2] * 1e3, 2)
            report.latency_p99_ms = round(ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))] * 1e3, 2)
        await gateway.close()
    return report
