"""Turn "the workers that exist now" into registry adds and removes.

Each discovery source reports its complete desired set of workers (URL -> role,
bootstrap port) per round. The reconciler adds the new ones and drains the ones that
left, through callbacks the server provides (the ``POST /workers`` /
``DELETE /workers`` path: probe, tokenizer, drain). It only ever removes workers it
added itself, so workers registered by hand or by another source are left alone.
A worker that fails its probe (still starting) is retried on the next round.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Target:
    url: str
    role: str | None = None  # None: what the worker reports
    bootstrap_port: int | None = None


AddWorker = Callable[[Target], Awaitable[object]]
RemoveWorker = Callable[[str], Awaitable[object]]  # by URL


class Reconciler:
    def __init__(self, source: str, add: AddWorker, remove: RemoveWorker) -> None:
        self.source = source
        self._add = add
        self._remove = remove
        self.managed: dict[str, Target] = {}  # URL -> target this source registered
        self._removing: dict[str, asyncio.Task[None]] = {}

    async def apply(self, desired: Mapping[str, Target]) -> None:
        """Add what is new (concurrently), start draining what left (in the background)."""
        new = [t for url, t in desired.items() if url not in self.managed]
        results = await asyncio.gather(*(self._add(t) for t in new), return_exceptions=True)
        for target, result in zip(new, results, strict=True):
            if isinstance(result, BaseException):
                if isinstance(result, asyncio.CancelledError):
                    raise result
                log.warning("%s: worker %s not added yet: %s", self.source, target.url, result)
            else:
                self.managed[target.url] = target
                log.info("%s: worker %s added", self.source, target.url)
        for url in [u for u in self.managed if u not in desired]:
            del self.managed[url]
            self._removing[url] = asyncio.ensure_future(self._drain(url))

    async def _drain(self, url: str) -> None:
        try:
            await self._remove(url)
            log.info("%s: worker %s gone from discovery, removed", self.source, url)
        except KeyError:
            pass  # already removed by hand
        except Exception:
            log.exception("%s: removing worker %s failed", self.source, url)
        finally:
            self._removing.pop(url, None)

    async def close(self) -> None:
        for task in list(self._removing.values()):
            task.cancel()
        await asyncio.gather(*self._removing.values(), return_exceptions=True)
