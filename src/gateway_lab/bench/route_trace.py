"""Request-level evidence of one in-process cell: what the policy saw, what was true, where the TTFT went.

An end-to-end TTFT percentile says that a tail exists, not which requests make it or
why. In an in-process cell (``bench trace``) the driver, the gateway and the simulated
workers share one process, so at the instant a policy decides, the workers' real queues
can be read beside the ``WorkerView`` the policy was given. ``RouteTracer``:

* wraps each pool's policy (``policy_maker``) so every decision is recorded with, per
  worker, what the gateway saw (its in-flight count, the prompt tokens it has queued
  there, the policy's own estimate of the uncached part, ``queued_uncached``) and what
  the simulator had (requests waiting or running, uncached prompt tokens still to
  prefill);
* attaches a ``sim.timeline.Timeline`` to every worker (``attach``): when the request
  reached its worker, got a slot, finished its prefill, and the queue it met there;
* joins both with the driver's results by request id (the driver sends ``X-Request-Id``,
  the gateway passes it to the worker as the gRPC request id): one row per request with
  its TTFT split into gateway (arrival to dispatch to worker), wait (for a slot and the
  step in progress), prefill (its own steps, with whatever else shared them) and return.

``summary`` sets the slowest requests beside all of them. Only evidence: nothing here
changes a decision (the wrapper calls the policy, then reads).

``StallWatch`` records when the whole process stood still (CPython's cyclic collections,
and the event loop waking late for any other reason): in an in-process cell one stall
delays every request in flight, whatever the policy chose, so the tail of a run is
read against its stalls (``summary``'s last line) before it is blamed on routing.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import statistics
import time
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from gateway.policies.base import Decision, Policy, RouteRequest, WorkerView
from gateway_lab.sim.timeline import Timeline

PolicyMaker = Callable[[str], Policy]
REQUEST_ID_PREFIX = "rt"  # the driver's request ids: rt-<index>


def host_port(url: str) -> str:
    return url.partition("://")[2] or url


@dataclass(slots=True)
class Probe:
    """One simulated worker's queue as it really is (``Scheduler`` of rank 0)."""

    scheduler: Any

    def queue(self) -> tuple[int, int]:
        """(requests waiting or running, uncached prompt tokens still to prefill)."""
        s = self.scheduler
        return s.num_waiting + s.num_running, s.queued_uncached_tokens()


@dataclass
class RouteTracer:
    """Decisions, the workers' truth at each, and per-worker timelines (see the module doc)."""

    clock: Callable[[], float] = time.perf_counter  # the driver's clock: rows subtract its start from these
    decisions: dict[str, dict[str, Any]] = field(default_factory=dict)
    probes: dict[str, Probe] = field(default_factory=dict)  # host:port -> probe
    timelines: dict[str, Timeline] = field(default_factory=dict)  # host:port -> timeline
    requests: list[dict[str, Any]] = field(default_factory=list)  # the joined rows, once a run is over
    watch: StallWatch | None = None  # the process's stalls while the run went (``watching``)

    def attach(self, workers: Iterable[Any]) -> None:
        """Give every simulated worker (``sim.worker.SimWorker``) a timeline and a probe."""
        for w in workers:
            key = host_port(w.url)
            timeline = Timeline(clock=self.clock)
            w.scheduler.timeline = timeline
            self.timelines[key] = timeline
            self.probes[key] = Probe(w.scheduler)

    @contextlib.asynccontextmanager
    async def watching(self) -> AsyncIterator[StallWatch]:
        """Record the process's stalls (``StallWatch``) while the body runs."""
        watch = self.watch = StallWatch(self.clock)
        watch.start()
        try:
            yield watch
        finally:
            await watch.stop()

    def policy_maker(self, make: PolicyMaker) -> PolicyMaker:
        """``make`` with every policy it returns recording its decisions here."""

        def traced(role: str) -> Policy:
            policy = make(role)
            select = policy.select

            def recorded(request: RouteRequest, workers: Sequence[WorkerView]) -> Decision:
                decision = select(request, workers)
                self.record(policy, request, workers, decision)
                return decision

            policy.select = recorded  # type: ignore[method-assign]  # the instance's own: isinstance checks still hold
            return policy

        return traced

    def record(self, policy: Policy, request: RouteRequest, workers: Sequence[WorkerView], decision: Decision) -> None:
        """One decision: per worker [in flight, queued prompt tokens, the policy's uncached
        estimate] as seen, and [requests, uncached tokens to prefill] as true."""
        estimate = getattr(policy, "queued_uncached", None)
        seen: dict[str, list[float]] = {}
        true: dict[str, list[int]] = {}
        for w in workers:
            q = float(estimate(w)) if estimate is not None else float(w.queued_prefill_tokens)
            seen[w.worker_id] = [w.in_flight, w.queued_prefill_tokens, round(q, 1)]
            probe = self.probes.get(host_port(w.url))
            if probe is not None:
                true[w.worker_id] = list(probe.queue())
        key = request.request_id
        if not key or request.exclude:  # a retry keeps its first decision's record
            return
        url = next((host_port(w.url) for w in workers if w.worker_id == decision.worker_id), "")
        self.decisions[key] = {
            "at": self.clock(), "worker": decision.worker_id, "reason": decision.reason,
            "predicted": decision.predicted_cached_tokens, "prompt": len(request.token_ids), "url": url,
            "scores": {k: round(v, 1) for k, v in decision.scores.items()}, "seen": seen, "true": true,
        }  # fmt: skip

    def rows(self, results: Sequence[Any], t0: float) -> list[dict[str, Any]]:
        """One row per driver result (``driver.RequestResult``; ``t0``: the run's start on the
        same clock), joined with its decision and its worker's timeline; times in ms."""
        out: list[dict[str, Any]] = []
        for r in results:
            rid = request_id(r.index)
            row: dict[str, Any] = {
                "index": r.index, "id": rid, "ok": r.ok, "start_s": round(r.start_s, 4),
                "ttft_ms": None if r.ttft_s is None else round(r.ttft_s * 1e3, 2),
                "prompt": r.prompt_tokens, "cached": r.cached_tokens, "worker": r.worker_id,
            }  # fmt: skip
            d = self.decisions.get(rid)
            start = t0 + r.start_s
            if self.watch is not None and r.ttft_s is not None:
                late = [e for e in self.watch.events if e[0] == "late"]
                collected = [e for e in self.watch.events if e[0] == "gc"]
                row["stalled_ms"] = _ms(overlapping(row, t0, late))  # the loop stood still (any cause)
                row["gc_ms"] = _ms(overlapping(row, t0, collected))  # of which cyclic collections
            if d is not None:
                chosen = d["worker"]
                row.update(reason=d["reason"], predicted=d["predicted"], chosen=chosen, scores=d["scores"],
                           seen=d["seen"], true=d["true"], routed_ms=_ms(d["at"] - start))
                timeline = self.timelines.get(d["url"])
                times = timeline.get(rid) if timeline is not None else None
                if times is not None:
                    row["worker_queue"] = {"requests": times.ahead_requests, "uncached": times.ahead_uncached,
                                           "step_left_ms": _ms(times.step_left_s)}
                    row["to_worker_ms"] = _ms(times.received - d["at"])
                    if times.admitted >= 0:
                        row["wait_ms"] = _ms(times.admitted - times.received)
                    if times.prefilled >= 0 and times.admitted >= 0:
                        row["prefill_ms"] = _ms(times.prefilled - times.admitted)
                        if r.ttft_s is not None:
                            row["back_ms"] = _ms(start + r.ttft_s - times.prefilled)
            out.append(row)
        return out


@dataclass
class StallWatch:
    """Where this process stood still: every cyclic collection of at least ``min_s`` (with its
    generation) and every wake-up of a ``period_s`` heartbeat that came ``min_s`` or more
    late (a collection, a long synchronous call, or the host not running the process).
    Events are (kind, generation or -1, start, seconds) on ``clock``."""

    clock: Callable[[], float] = time.perf_counter
    min_s: float = 0.02
    period_s: float = 0.005
    events: list[tuple[str, int, float, float]] = field(default_factory=list)
    _gc_start: float = 0.0
    _task: asyncio.Task[None] | None = None

    def _on_gc(self, phase: str, info: dict[str, int]) -> None:
        now = self.clock()
        if phase == "start":
            self._gc_start = now
        elif now - self._gc_start >= self.min_s:
            self.events.append(("gc", info.get("generation", -1), self._gc_start, now - self._gc_start))

    async def _beat(self) -> None:
        while True:
            t = self.clock()
            await asyncio.sleep(self.period_s)
            late = self.clock() - t - self.period_s
            if late >= self.min_s:
                self.events.append(("late", -1, t + self.period_s, late))

    def start(self) -> None:
        gc.callbacks.append(self._on_gc)
        self._task = asyncio.get_running_loop().create_task(self._beat())

    async def stop(self) -> None:
        if self._on_gc in gc.callbacks:
            gc.callbacks.remove(self._on_gc)
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    def lines(self) -> list[str]:
        """The collections and late wake-ups, counted and summed."""
        out = []
        for kind in ("gc", "late"):
            got = [e for e in self.events if e[0] == kind]
            if got:
                gens = f" (generations {sorted({e[1] for e in got})})" if kind == "gc" else ""
                out.append(f"{kind}: {len(got)} of {self.min_s * 1e3:.0f} ms or more{gens}, {sum(e[3] for e in got) * 1e3:.0f} ms "
                           f"in all, longest {max(e[3] for e in got) * 1e3:.0f} ms")
        return out or [f"no stall of {self.min_s * 1e3:.0f} ms or more"]


def overlapping(row: dict[str, Any], t0: float, events: Sequence[tuple[str, int, float, float]]) -> float:
    """Seconds of ``events`` that fell inside the request's wait for its first token."""
    if row.get("ttft_ms") is None:
        return 0.0
    a = t0 + row["start_s"]
    b = a + row["ttft_ms"] / 1e3
    return sum(max(0.0, min(b, s + d) - max(a, s)) for _, _, s, d in events)


def request_id(index: int) -> str:
    return f"{REQUEST_ID_PREFIX}-{index}"


def _ms(seconds: float) -> float:
    return round(seconds * 1e3, 2)


PHASES = ("routed_ms", "to_worker_ms", "wait_ms", "prefill_ms", "back_ms", "stalled_ms", "gc_ms")


def _mean(rows: Sequence[dict[str, Any]], key: str) -> float | None:
    values = [r[key] for r in rows if r.get(key) is not None]
    return statistics.fmean(values) if values else None


def misjudged(row: dict[str, Any]) -> bool:
    """The chosen worker really had more uncached prefill ahead than the least loaded worker
    by the truth, while the gateway's estimate for it said no more than that worker's."""
    seen, true, chosen = row.get("seen") or {}, row.get("true") or {}, row.get("chosen")
    if chosen not in true or chosen not in seen or not true:
        return False
    least = min(true, key=lambda w: true[w][1])
    return bool(true[chosen][1] > true[least][1] and seen[chosen][2] <= seen.get(least, [0, 0, 0.0])[2])


def summary(rows: Sequence[dict[str, Any]], share: float = 0.01) -> list[str]:
    """The slowest ``share`` of requests by TTFT beside all: their phases, reasons, and the
    queue their worker had (as the gateway estimated it, as it was)."""
    timed = sorted((r for r in rows if r.get("ttft_ms") is not None), key=lambda r: r["ttft_ms"])
    if not timed:
        return ["no timed requests"]
    n = max(1, round(len(timed) * share))
    tail = timed[-n:]
    lines = [f"{len(timed)} requests; slowest {n} (TTFT {tail[0]['ttft_ms']:.0f}-{tail[-1]['ttft_ms']:.0f} ms): "
             "mean phases ms, tail / all"]  # fmt: skip
    parts = []
    for phase in ("ttft_ms", *PHASES):
        a, b = _mean(tail, phase), _mean(timed, phase)
        if a is not None and b is not None:
            parts.append(f"{phase[:-3]} {a:.1f} / {b:.1f}")
    lines.append("  " + ", ".join(parts))
    lines.append("  tail reasons: " + ", ".join(f"{k} {v}" for k, v in _count(r.get("reason", "?") for r in tail)))
    est = [r["seen"][r["chosen"]][2] for r in tail if r.get("chosen") in (r.get("seen") or {})]
    true = [r["true"][r["chosen"]][1] for r in tail if r.get("chosen") in (r.get("true") or {})]
    met = [r["worker_queue"]["uncached"] for r in tail if "worker_queue" in r]
    if est and true:
        arrived = f", met on arrival {statistics.fmean(met):.0f}" if met else ""
        lines.append(f"  tail: uncached prefill ahead on the chosen worker, mean tokens: estimated {statistics.fmean(est):.0f}, "
                     f"true at decision {statistics.fmean(true):.0f}{arrived}; misjudged (a lighter worker existed, "
                     f"the estimate said otherwise) {sum(map(misjudged, tail))}")
        behind = [r for r in timed if ahead(r) >= BEHIND_TOKENS]
        lines.append(f"  behind >= {BEHIND_TOKENS} uncached tokens on its worker (see ahead): {len(behind)} of all "
                     f"({len(behind) / len(timed):.1%}), {sum(1 for r in tail if ahead(r) >= BEHIND_TOKENS)} of the tail; "
                     f"of those, reasons: " + ", ".join(f"{k} {v}" for k, v in _count(r.get("reason", "?") for r in behind)))
    return lines


BEHIND_TOKENS = 1024  # a request sent behind this much uncached prefill waits for it (a step or more)


def ahead(row: dict[str, Any]) -> int:
    """Uncached prompt tokens truly ahead of the request on its worker: what it met there on
    arrival (a worker's timeline), else what was queued when it was routed (the pure
    simulation, where a dispatch arrives at once; end to end, requests still on the wire
    to the worker are not in its queue at the decision yet)."""
    met = row.get("worker_queue")
    if met is not None:
        return int(met["uncached"])
    true, chosen = row.get("true") or {}, row.get("chosen")
    return int(true[chosen][1]) if chosen in true else 0


def _count(values: Iterable[str]) -> list[tuple[str, int]]:
    counts: dict[str, int] = {}
    for v in values:
        counts[v] = counts.get(v, 0) + 1
    return sorted(counts.items(), key=lambda kv: -kv[1])


def write_rows(path: str | Path, rows: Iterable[dict[str, Any]], **extra: Any) -> None:
    """Append ``rows`` (with ``extra`` fields, e.g. fleet and policy) to a JSONL file."""
    with Path(path).open("ab") as f:
        for row in rows:
            f.write(orjson.dumps({**extra, **row}) + b"\n")
