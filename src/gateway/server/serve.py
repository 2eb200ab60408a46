"""`token-gateway serve`: the gateway process (HTTP front door over gRPC workers)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import signal
import socket
import sys

import orjson

# Config dataclasses are imported lazily in add_arguments' callers' process anyway;
# they are light (no FastAPI/transformers at import).
from gateway.policies.factory import PolicyConfig
from gateway.routing.dispatch import DispatchConfig
from gateway.routing.engine import EngineConfig
from gateway.routing.pd import PdConfig, PdFlagError, parse_pool_flags
from gateway.routing.retry import RetryConfig
from gateway.server.config import GatewayConfig, ServerConfig
from gateway.settings import add_options, from_namespace

log = logging.getLogger("gateway")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_options(parser.add_argument_group("server"), ServerConfig)
    add_options(parser.add_argument_group("routing policy"), PolicyConfig)
    add_options(parser.add_argument_group("pipeline"), EngineConfig)
    add_options(parser.add_argument_group("retries"), RetryConfig)
    add_options(parser.add_argument_group("worker streams"), DispatchConfig)
    pd = parser.add_argument_group("prefill/decode disaggregation")
    pd.add_argument("--prefill", nargs="+", action="append", default=[], metavar="URL [BOOTSTRAP_PORT]",
                    help="prefill worker(s): grpc://host:port, each optionally followed by its bootstrap port "
                    "(default: learned from GetServerInfo); repeatable")
    pd.add_argument("--decode", nargs="+", action="append", default=[], metavar="URL",
                    help="decode worker(s): grpc://host:port; repeatable")
    add_options(pd, PdConfig)


def config_from_args(args: argparse.Namespace) -> GatewayConfig:
    return GatewayConfig(
        server=from_namespace(ServerConfig, args),
        policy=from_namespace(PolicyConfig, args),
        engine=from_namespace(EngineConfig, args),
        retry=from_namespace(RetryConfig, args),
        dispatch=from_namespace(DispatchConfig, args),
        pd=from_namespace(
            PdConfig, args,
            prefill=parse_pool_flags(args.prefill, allow_port=True),
            decode=parse_pool_flags(args.decode, allow_port=False),
        ),
    )


class _JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out = {"ts": record.created, "level": record.levelname.lower(), "logger": record.name, "msg": record.getMessage()}
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return orjson.dumps(out).decode()


def setup_logging(level: str, as_json: bool) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_JsonFormatter() if as_json else logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())


async def serve(config: GatewayConfig) -> None:
    import uvicorn

    from gateway.server.app import create_app
    from gateway.server.state import GatewayState

    state = GatewayState(config)
    await state.start()
    app = create_app(state, manage_lifecycle=False)
    sock = socket.socket(socket.AF_INET6 if ":" in config.server.host else socket.AF_INET)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((config.server.host, config.server.port))
    host, port = sock.getsockname()[:2]
    uv_config = uvicorn.Config(
        app, log_level="warning", access_log=False, loop="none", http="httptools", lifespan="off",
        timeout_graceful_shutdown=30,
    )
    server = uvicorn.Server(uv_config)
    shown = f"[{host}]" if ":" in host else host
    ready = {"event": "ready", "url": f"http://{shown}:{port}", "workers": len(state.registry.all()),
             "models": state.catalog.names(), "policy": config.policy.policy}
    loop = asyncio.get_running_loop()
    serving = asyncio.ensure_future(server.serve(sockets=[sock]))
    # uvicorn exposes only a `started` flag, no event to wait on.
    while not server.started and not serving.done():  # noqa: ASYNC110
        await asyncio.sleep(0.01)
    print(orjson.dumps(ready).decode(), flush=True)

    def stop() -> None:
        server.should_exit = True

    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop)
    try:
        await serving
    finally:
        await state.stop()


def run(args: argparse.Namespace) -> int:
    try:
        config = config_from_args(args)
    except PdFlagError as exc:
        setup_logging("error", False)
        log.error("%s", exc)
        return 2
    setup_logging(config.server.log_level, config.server.log_json)
    if not (config.server.worker_urls or config.pd.prefill or config.pd.decode):
        log.error("no workers: give --worker-urls grpc://host:port ... (or --prefill/--decode)")
        return 2
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    try:
        asyncio.run(serve(config))
    except KeyboardInterrupt:
        return 0
    except RuntimeError as exc:
        log.error("%s", exc)
        return 1
    return 0
