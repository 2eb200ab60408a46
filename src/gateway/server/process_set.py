"""A serving process's view of the set it belongs to (``serve --processes N``).

The supervisor gives each child its index, the set's size and a private run folder.
There the supervisor keeps ``set.json`` (which processes are alive, restarts), which
``/health`` reports, and each child serves its own Prometheus exposition on a unix
socket (``metrics-INDEX.sock``: connect, read to EOF). Whichever child a scrape
reaches gathers its siblings' expositions and answers for the whole set, every
series labelled with ``process``, so the custom scrape-time collectors keep working.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import orjson
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

log = logging.getLogger(__name__)

ENV_INDEX = "TOKEN_GATEWAY_PROCESS_INDEX"
ENV_COUNT = "TOKEN_GATEWAY_PROCESS_COUNT"
ENV_RUN_DIR = "TOKEN_GATEWAY_RUN_DIR"
STATUS_FILE = "set.json"
PARKING_FILE = "parking.json"  # the processes that take connections (server.parking); absent: all
SIBLING_TIMEOUT_S = 2.0


def metrics_socket(run_dir: Path, index: int) -> Path:
    return run_dir / f"metrics-{index}.sock"


def write_parking(run_dir: Path, active: list[int]) -> None:
    """Tell the set which processes take connections (the supervisor; atomic replace)."""
    tmp = run_dir / (PARKING_FILE + ".tmp")
    tmp.write_bytes(orjson.dumps({"active": active}))
    tmp.replace(run_dir / PARKING_FILE)


def read_parking(run_dir: Path) -> list[int] | None:
    """The processes that take connections, or None when the supervisor has parked none."""
    try:
        active = orjson.loads((run_dir / PARKING_FILE).read_bytes())["active"]
    except (OSError, orjson.JSONDecodeError, KeyError, TypeError):
        return None
    return [int(i) for i in active] if isinstance(active, list) else None


def in_process_set() -> bool:
    """Whether the supervisor started this process (one of ``serve --processes N``)."""
    return ENV_INDEX in os.environ


def member_from_env(render: Callable[[], bytes]) -> SetMember | None:
    """This process's membership, when the supervisor started it (else None)."""
    if ENV_INDEX not in os.environ:
        return None
    return SetMember(int(os.environ[ENV_INDEX]), int(os.environ[ENV_COUNT]), Path(os.environ[ENV_RUN_DIR]), render)


class SetMember:
    def __init__(self, index: int, count: int, run_dir: Path, render: Callable[[], bytes]) -> None:
        self.index = index
        self.count = count
        self.run_dir = run_dir
        self._render = render
        self._server: asyncio.AbstractServer | None = None

    async def start(self) -> None:
        path = metrics_socket(self.run_dir, self.index)
        with contextlib.suppress(FileNotFoundError):
            path.unlink()  # left by this slot's previous process
        self._server = await asyncio.start_unix_server(self._serve, path=str(path))

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            writer.write(self._render())
            await writer.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            writer.close()

    def describe(self) -> dict[str, Any]:
        """``/health``'s ``processes`` object: the supervisor's account of the set."""
        out: dict[str, Any] = {"this": self.index, "expected": self.count}
        try:
            out.update(orjson.loads((self.run_dir / STATUS_FILE).read_bytes()))
        except (OSError, orjson.JSONDecodeError):
            out["alive"] = None
        return out

    async def _sibling(self, index: int) -> bytes | None:
        try:
            async with asyncio.timeout(SIBLING_TIMEOUT_S):
                reader, writer = await asyncio.open_unix_connection(str(metrics_socket(self.run_dir, index)))
                try:
                    return await reader.read()
                finally:
                    writer.close()
        except (OSError, TimeoutError):
            return None  # restarting or gone: the scrape answers for the others

    async def federate(self, own: bytes) -> bytes:
        """Every process's exposition, merged by family, each series labelled ``process``."""
        others = [i for i in range(self.count) if i != self.index]
        bodies = await asyncio.gather(*(self._sibling(i) for i in others))
        parts = [(self.index, own), *((i, b) for i, b in zip(others, bodies, strict=True) if b is not None)]
        return merge_expositions(parts)


def merge_expositions(parts: list[tuple[int, bytes]]) -> bytes:
    families: dict[str, Metric] = {}
    for index, body in sorted(parts):
        label = str(index)
        for fam in text_string_to_metric_families(body.decode()):
            merged = families.get(fam.name)
            if merged is None:
                merged = families[fam.name] = Metric(fam.name, fam.documentation, fam.type, fam.unit)
            merged.samples.extend(
                Sample(s.name, {"process": label, **s.labels}, s.value, s.timestamp, s.exemplar) for s in fam.samples
            )

    class _Merged:
        def collect(self) -> Iterator[Metric]:
            return iter(families.values())

    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Merged())  # type: ignore[arg-type]
    return generate_latest(registry)
