"""The health-check loop: probes workers on an interval, with thresholds both ways.

A real SGLang ``HealthCheck`` runs a one-token generation on the GPU, so probes are
kept cheap and rare: a worker that completed an ordinary request within the last
interval is not probed at all (the request is the evidence), and a failed request
only asks for an early probe, it does not mark the worker down by itself (that is
the circuit breaker's job, kept separate). ``failure_threshold`` failed probes in a
row take a worker out of rotation; ``success_threshold`` good ones bring it back
(and close its breaker, since the probes proved it answers again).
``Worker.available`` is then ``healthy and breaker allows`` (and not draining).
An engine's data-parallel ranks are probed together: one probe per engine, its
outcome judged for each rank (health is the engine's; breakers are each rank's).
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass

from gateway.settings import option
from gateway.workers.breaker import CircuitBreaker
from gateway.workers.periodic import Periodic
from gateway.workers.registry import WorkerRegistry
from gateway.workers.transport import WorkerCallError
from gateway.workers.worker import Worker, one_per_engine, start_time_of

log = logging.getLogger(__name__)


@dataclass
class HealthConfig:
    health_check_interval_s: float = option(30.0, "seconds between health probes of a worker with no recent successful request (0: no health checks)")
    health_check_timeout_s: float = option(5.0, "time a worker has to answer a health probe, seconds")
    health_failure_threshold: int = option(3, "failed probes in a row that mark a worker unhealthy")
    health_success_threshold: int = option(2, "good probes in a row that bring an unhealthy worker back")
    health_unhealthy_interval_s: float = option(2.0, "seconds between probes of a worker that is unhealthy or just failed a request")
    breaker_failure_threshold: int = option(3, "circuit breaker: failed requests in a row that open it")
    breaker_cooldown_s: float = option(5.0, "circuit breaker: seconds open before half-open trial requests are let through")
    breaker_window_s: float = option(30.0, "circuit breaker: sliding window of request outcomes judged by --breaker-failure-ratio, seconds")
    breaker_min_requests: int = option(10, "circuit breaker: outcomes the window must hold before the failure ratio can open it")
    breaker_failure_ratio: float = option(0.3, "circuit breaker: share of failed requests in the window that opens it")
    breaker_half_open_probes: int = option(2, "circuit breaker: real requests let through half-open; that many successes close it, one failure re-opens it")

    def __post_init__(self) -> None:
        if not 0.0 < self.breaker_failure_ratio <= 1.0:
            raise ValueError("breaker_failure_ratio must be in (0, 1]")
        if self.breaker_window_s <= 0 or self.breaker_min_requests < 1 or self.breaker_half_open_probes < 1:
            raise ValueError("breaker_window_s must be > 0, breaker_min_requests and breaker_half_open_probes >= 1")

    def breaker(self) -> CircuitBreaker:
        return CircuitBreaker(
            self.breaker_failure_threshold,
            self.breaker_cooldown_s,
            window_s=self.breaker_window_s,
            min_requests=self.breaker_min_requests,
            failure_ratio=self.breaker_failure_ratio,
            half_open_probes=self.breaker_half_open_probes,
        )


class HealthMonitor(Periodic):
    name = "health-monitor"

    def __init__(self, registry: WorkerRegistry, config: HealthConfig | None = None) -> None:
        self.registry = registry
        self.config = config or HealthConfig()
        super().__init__()
        self.probes = 0

    def due(self, worker: Worker, now: float) -> bool:
        """Whether ``worker`` should be probed at ``now``."""
        cfg = self.config
        if worker.draining:
            return False
        if not worker.healthy or worker.suspect or worker.failures:
            return now - worker.last_probe_at >= cfg.health_unhealthy_interval_s
        if now - worker.last_ok_at < cfg.health_check_interval_s:
            return False  # a recent success is evidence enough
        return now - worker.last_probe_at >= cfg.health_check_interval_s

    async def probe(self, worker: Worker, ranks: list[Worker] | None = None) -> bool:
        """One probe of ``worker``'s engine; updates the health of each of ``ranks`` (default:
        the worker alone; an engine's DP ranks share its process, so one probe judges them
        all) and returns whether it answered healthy."""
        cfg = self.config
        started = time.monotonic()
        targets = ranks or [worker]
        for w in targets:
            w.last_probe_at = started
            w.suspect = False
        self.probes += 1
        try:
            reply = await worker.client.health_check(timeout=cfg.health_check_timeout_s)
            ok = bool(reply.healthy)
            reason = reply.message
        except asyncio.CancelledError:
            raise
        except WorkerCallError as exc:
            ok, reason = False, exc.code.name
        except Exception as exc:  # a closed channel or the like: still a failed probe
            ok, reason = False, type(exc).__name__
        recovered = [w for w in targets if self._judge(w, ok, reason, started)]
        if recovered:
            await self._check_restart(recovered[0])
        return ok

    def _judge(self, worker: Worker, ok: bool, reason: str, started: float) -> bool:
        """Apply one probe's outcome to one target; True when it brought it back."""
        cfg = self.config
        if ok:
            worker.failures = 0
            worker.successes += 1
            worker.last_ok_at = time.monotonic()
            worker.progress.alive(worker.last_ok_at)  # it runs: evidence for its silent answers
            if not worker.healthy and worker.successes >= cfg.health_success_threshold:
                worker.healthy = True
                # The probes proved it back; its breaker's record is from before the outage.
                worker.breaker.reset()
                log.info("worker %s is healthy again; back in rotation", worker.id)
                return True
        elif worker.progress.last_message_at >= started:
            # Its streams kept delivering while the probe waited: a busy worker (a real
            # worker's probe is a generation queued behind the burst), not a dead one.
            log.debug("worker %s: probe failed (%s) while its streams progressed; not counted", worker.id, reason)
        else:
            worker.successes = 0
            worker.failures += 1
            if worker.healthy and worker.failures >= cfg.health_failure_threshold:
                worker.healthy = False
                log.warning(
                    "worker %s unhealthy after %d failed probes (%s); out of rotation",
                    worker.id, worker.failures, reason,
                )
        return False

    async def _check_restart(self, worker: Worker) -> None:
        """After an outage: a worker whose start time changed was restarted, its cache is
        empty, and the policies must forget what they learned of it now, not as eviction
        or the closed loop get to it."""
        try:
            info = await worker.client.server_info(timeout=self.config.health_check_timeout_s)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # no evidence either way: keep what is known
            log.debug("worker %s: GetServerInfo after recovery failed: %s", worker.id, exc)
            return
        started = start_time_of(info)
        if started and worker.info.start_time and started != worker.info.start_time:
            worker.info.start_time = started
            self.registry.restarted(worker)
        elif started:
            worker.info.start_time = started

    async def check_once(self) -> None:
        """Probe each engine with a target due, once, for all its live targets."""
        now = time.monotonic()
        live = [w for w in self.registry.all() if not w.draining]
        due = one_per_engine([w for w in live if self.due(w, now)])
        if due:
            await asyncio.gather(*(self.probe(h, [w for w in live if w.client is h.client]) for h in due))

    def interval_s(self) -> float:
        if self.config.health_check_interval_s <= 0:
            return 0.0
        return max(0.05, min(self.config.health_check_interval_s, self.config.health_unhealthy_interval_s) / 4)

    async def round(self) -> None:
        await self.check_once()
