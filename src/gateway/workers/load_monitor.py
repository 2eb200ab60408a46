"""Polls workers' GetLoads, but only where a routing policy uses the figures.

Policies that weigh the workers' own queue figures (``policy.needs_loads``) read
them from ``Worker.polled`` through ``WorkerView.loads``; ``needed(worker)`` says
whether the policy of the worker's pool is one of them, and other workers are not
asked at all, nor are workers whose engine has no loads to give (``lacks``). An engine
with data-parallel ranks is asked once per round; its reply lists each rank, and each
rank's target takes its own row.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from gateway.policies.base import LoadSnapshot
from gateway.proto import sglang_scheduler_pb2 as pb
from gateway.settings import option
from gateway.workers.periodic import Periodic
from gateway.workers.registry import WorkerRegistry
from gateway.workers.worker import Worker, one_per_engine

log = logging.getLogger(__name__)


@dataclass
class LoadMonitorConfig:
    load_poll_interval_s: float = option(0.5, "seconds between GetLoads polls, when the policy uses worker loads (0: never poll)")
    load_poll_timeout_s: float = option(2.0, "time a worker has to answer GetLoads, seconds")


def snapshot(reply: pb.GetLoadsResponse, dp_rank: int | None = None) -> LoadSnapshot:
    """One rank's figures (``dp_rank``), or the whole engine's: queues and tokens summed
    over its DP ranks, ratios averaged. A rank the reply does not list has none."""
    loads = [x for x in reply.loads if dp_rank is None or x.dp_rank == dp_rank]
    if not loads:
        return LoadSnapshot()
    n = len(loads)
    return LoadSnapshot(
        num_running_reqs=sum(x.num_running_reqs for x in loads),
        num_waiting_reqs=sum(x.num_waiting_reqs for x in loads),
        num_used_tokens=sum(x.num_used_tokens for x in loads),
        max_total_num_tokens=sum(x.max_total_num_tokens for x in loads),
        token_usage=sum(x.token_usage for x in loads) / n,
        num_waiting_uncached_tokens=sum(x.num_waiting_uncached_tokens for x in loads),
        cache_hit_rate=sum(x.cache_hit_rate for x in loads) / n,
    )


class LoadMonitor(Periodic):
    name = "load-monitor"

    def __init__(
        self,
        registry: WorkerRegistry,
        needed: Callable[[Worker], bool],
        config: LoadMonitorConfig | None = None,
    ) -> None:
        self.registry = registry
        self.needed = needed
        self.config = config or LoadMonitorConfig()
        self.polls = 0
        super().__init__()

    async def poll(self, worker: Worker, ranks: list[Worker] | None = None) -> None:
        """One GetLoads call on ``worker``'s engine; each of ``ranks`` (default: the worker
        alone) takes its own rank's row, a worker without a rank the engine's sum."""
        try:
            reply = await worker.client.loads(timeout=self.config.load_poll_timeout_s)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a missed poll only ages the old figures
            log.debug("GetLoads on %s failed: %s", worker.engine_id, exc)
            return
        now = time.monotonic()
        for rank in ranks or [worker]:
            rank.polled = snapshot(reply, rank.dp_rank)
            rank.polled_at = now
        self.polls += 1

    async def poll_once(self) -> bool:
        """Poll, once per engine, the live workers whose pool's policy needs loads;
        returns whether any was."""
        workers = [
            w for w in self.registry.all()
            if not w.draining and w.healthy and "loads" not in w.client.lacks and self.needed(w)
        ]
        heads = one_per_engine(workers)
        await asyncio.gather(*(self.poll(h, [w for w in workers if w.client is h.client]) for h in heads))
        return bool(workers)

    def interval_s(self) -> float:
        return self.config.load_poll_interval_s

    async def round(self) -> None:
        await self.poll_once()
