"""``--prometheus-port``: ``/metrics`` on a port of its own (SMG's flag name).

Operators often scrape on an internal port and expose only the API port. The
metrics app is a bare ASGI app served by a second uvicorn server on the same event
loop, so collectors read live gateway state on the loop that owns it (no thread).
The API port keeps its own ``/metrics`` as before.
"""

from __future__ import annotations

import asyncio
import socket
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gateway.settings import option

if TYPE_CHECKING:  # the config dataclass stays light to import (the CLI builds every parser)
    from gateway.observability.metrics import GatewayMetrics


@dataclass
class MetricsPortConfig:
    prometheus_port: int | None = option(None, "also serve /metrics on this port (0: pick a free one; unset: only on --port)")
    prometheus_host: str | None = option(None, "address the --prometheus-port server binds (unset: --host)")


class MetricsApp:
    def __init__(self, metrics: GatewayMetrics) -> None:
        self.metrics = metrics

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        from gateway.observability.metrics import CONTENT_TYPE_LATEST

        if scope["type"] != "http":
            return
        if scope["path"] == "/metrics" and scope["method"] in ("GET", "HEAD"):
            status, body, ctype = 200, self.metrics.render(), CONTENT_TYPE_LATEST
            if self.metrics.federate is not None:  # serve --processes N: the whole set's series
                body = await self.metrics.federate(body)
        else:
            status, body, ctype = 404, b"not found: this port serves GET /metrics\n", "text/plain"
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", ctype.encode()), (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": b"" if scope["method"] == "HEAD" else body})


class MetricsServer:
    """The running metrics port; ``url`` once started."""

    def __init__(self, metrics: GatewayMetrics, host: str, port: int) -> None:
        import uvicorn

        self._sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind((host, port))
        bound_host, self.port = self._sock.getsockname()[:2]
        shown = f"[{bound_host}]" if ":" in bound_host else bound_host
        self.url = f"http://{shown}:{self.port}/metrics"
        config = uvicorn.Config(MetricsApp(metrics), log_level="warning", access_log=False, loop="none",
                                lifespan="off")
        self._server = uvicorn.Server(config)
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self._task = asyncio.ensure_future(self._server.serve(sockets=[self._sock]))
        while not self._server.started and not self._task.done():  # noqa: ASYNC110
            await asyncio.sleep(0.01)
        if self._task.done():
            self._task.result()

    async def stop(self) -> None:
        self._server.should_exit = True
        if self._task is not None:
            await self._task


async def start_metrics_server(metrics: GatewayMetrics, config: MetricsPortConfig, default_host: str) -> MetricsServer | None:
    if config.prometheus_port is None:
        return None
    server = MetricsServer(metrics, config.prometheus_host or default_host, config.prometheus_port)
    await server.start()
    return server
