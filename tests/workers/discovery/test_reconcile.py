"""The reconciler: adds what appeared, drains what left, retries what failed, leaves others alone."""

from __future__ import annotations

import asyncio

from gateway.workers.discovery.reconcile import Reconciler, Target


class FakeRegistry:
    def __init__(self) -> None:
        self.workers: set[str] = {"grpc://manual:1"}
        self.failing: set[str] = set()

    async def add(self, target: Target) -> object:
        if target.url in self.failing:
            raise RuntimeError("still starting")
        self.workers.add(target.url)
        return target

    async def remove(self, url: str) -> object:
        if url not in self.workers:
            raise KeyError(url)
        await asyncio.sleep(0.01)  # a drain
        self.workers.discard(url)
        return url


def _targets(*urls: str) -> dict[str, Target]:
    return {u: Target(u) for u in urls}


async def test_add_remove_retry() -> None:
    reg = FakeRegistry()
    rec = Reconciler("test", reg.add, reg.remove)
    reg.failing = {"grpc://b:1"}
    await rec.apply(_targets("grpc://a:1", "grpc://b:1"))
    assert reg.workers == {"grpc://manual:1", "grpc://a:1"}
    reg.failing = set()
    await rec.apply(_targets("grpc://a:1", "grpc://b:1"))  # b is retried
    assert reg.workers == {"grpc://manual:1", "grpc://a:1", "grpc://b:1"}
    await rec.apply(_targets("grpc://b:1"))
    await asyncio.sleep(0.05)
    assert reg.workers == {"grpc://manual:1", "grpc://b:1"}  # the manual worker stays
    reg.workers.discard("grpc://b:1")  # removed by hand meanwhile
    await rec.apply({})
    await rec.close()
    assert rec.managed == {}
