"""Everything one gateway process owns, built from its config, started and stopped together."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

from gateway.policies.factory import close_policy, make_policy
from gateway.routing.engine import Engine
from gateway.routing.models import ModelCatalog
from gateway.routing.router import PolicyMaker, Router
from gateway.server.config import GatewayConfig
from gateway.workers.registry import WorkerRegistry
from gateway.workers.worker import Worker

log = logging.getLogger(__name__)


class GatewayState:
    def __init__(self, config: GatewayConfig, *, policy_maker: PolicyMaker | None = None) -> None:
        """``policy_maker`` (role -> policy) replaces ``make_policy(config.policy)``; the
        benchmark uses it for its evaluation-only oracle."""
        self.config = config
        server = config.server
        self.registry = WorkerRegistry(
            worker_api_key=server.worker_api_key, probe_timeout_s=server.probe_timeout_s
        )
        self.router = Router(self.registry, policy_maker or (lambda role: make_policy(config.policy)))
        self.catalog = ModelCatalog(
            Path(server.tokenizer_cache_dir),
            tokenizer_path=server.tokenizer_path,
            served_name=server.model,
        )
        self.engine = Engine(
            self.router,
            self.catalog,
            config=config.engine,
            retry=config.retry,
            dispatch=config.dispatch,
        )
        self.ready = False

    async def add_worker(self, url: str, *, role: str | None = None, bootstrap_port: int | None = None) -> Worker:
        """Probe, register and load the model's tokenizer before the worker takes traffic."""
        worker = await self.registry.add(url, role=role, bootstrap_port=bootstrap_port)
        try:
            await self.catalog.ensure(worker)
        except BaseException:
            await self.registry.remove(worker.id, drain_timeout_s=0)
            raise
        return worker

    async def start(self) -> None:
        urls = self.config.server.worker_urls
        results = await asyncio.gather(*(self.add_worker(u) for u in urls), return_exceptions=True)
        failed = [(u, r) for u, r in zip(urls, results, strict=True) if isinstance(r, BaseException)]
        for url, exc in failed:
            log.error("worker %s not added: %s", url, exc)
        if urls and len(failed) == len(urls):
            raise RuntimeError(f"none of the {len(urls)} workers could be added: {failed[0][1]}")
        self.ready = bool(self.registry.all())

    async def stop(self) -> None:
        for policy in self.router.policies().values():
            close_policy(policy)
        self.engine.close()
        await self.registry.close()
