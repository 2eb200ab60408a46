"""Fakes of what the sync layer reads: the registry's workers and the router's policies."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from gateway.policies.base import WorkerView
from gateway.policies.cache_aware import CacheAwarePolicy
from gateway.workers.load import WorkerLoad

WORKERS = ("w0:1", "w1:1")


class FakeWorkers:
    def __init__(self, page: int = 1) -> None:
        self.w = {
            wid: SimpleNamespace(id=wid, model="m", role="regular", load=WorkerLoad(), remote_load=WorkerLoad(),
                                 info=SimpleNamespace(page_size=page))
            for wid in WORKERS
        }

    def get(self, wid: str) -> Any:
        return self.w.get(wid)

    def all(self) -> list[Any]:
        return list(self.w.values())


class FakeRouter:
    def __init__(self) -> None:
        self.p = CacheAwarePolicy(eviction_interval_s=0)
        self.p.on_workers_changed([WorkerView(wid, wid) for wid in WORKERS])

    def policy(self, model: str, role: str) -> CacheAwarePolicy:
        return self.p
