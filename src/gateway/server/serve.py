"""`token-gateway serve`: the gateway process (HTTP front door over gRPC workers)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import logging
import signal
import socket
import sys
from typing import Any

import orjson

# Config dataclasses are imported lazily in add_arguments' callers' process anyway;
# they are light (no FastAPI/transformers at import).
from gateway import help_tiers
from gateway.observability.tracing import TracingConfig
from gateway.parsers.config import ParserConfig
from gateway.pipeline.aborts import flush_aborts
from gateway.pipeline.dispatch import DispatchConfig
from gateway.pipeline.engine import EngineConfig
from gateway.pipeline.limits import LimitsConfig
from gateway.pipeline.mcp_client import McpConfig
from gateway.pipeline.pd import PdConfig, PdFlagError, parse_pool_flags
from gateway.pipeline.resume import ResumeConfig
from gateway.pipeline.retry import RetryConfig
from gateway.pipeline.store.config import HistoryConfig
from gateway.policies.factory import PolicyConfig
from gateway.server import smg_compat
from gateway.server.admission import AdmissionConfig
from gateway.server.config import GatewayConfig, ServerConfig
from gateway.server.http.limits import HttpLimitsConfig
from gateway.server.metrics_port import MetricsPortConfig
from gateway.server.process_config import ProcessConfig
from gateway.server.secrets import SecretFileError, SecretFilesConfig, apply_secret_files
from gateway.server.security import InsecureAdminError, SecurityConfig, check_startup
from gateway.server.tls import FrontTlsConfig, TlsConfigError
from gateway.settings import add_options, from_namespace, mark_explicit
from gateway.sync.config import SyncConfig
from gateway.workers.discovery.config import DiscoveryConfig
from gateway.workers.discovery.sources import check_discovery
from gateway.workers.health import HealthConfig
from gateway.workers.load_monitor import LoadMonitorConfig
from gateway.workers.watchdog import WatchdogConfig

log = logging.getLogger("gateway")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    cfg = parser.add_argument_group("configuration (flag > TOKEN_GATEWAY_* environment > file > default)")
    cfg.add_argument("--config", metavar="FILE", default=None,
                     help="TOML or YAML file of settings, keys named like the flags (also TOKEN_GATEWAY_CONFIG)")
    cfg.add_argument("--print-config", action="store_true",
                     help="print the settings in effect as YAML, usable as --config, and exit (secrets that are set are named in comments, not printed)")
    add_options(parser.add_argument_group("server"), ServerConfig)
    add_options(parser.add_argument_group("routing policy"), PolicyConfig)
    add_options(parser.add_argument_group("pipeline"), EngineConfig)
    add_options(parser.add_argument_group("retries"), RetryConfig)
    add_options(parser.add_argument_group("worker streams"), DispatchConfig)
    add_options(parser.add_argument_group("admission"), AdmissionConfig)
    add_options(parser.add_argument_group("request limits"), LimitsConfig)
    add_options(parser.add_argument_group("security"), SecurityConfig)
    add_options(parser.add_argument_group("HTTP connection limits"), HttpLimitsConfig)
    add_options(parser.add_argument_group("secrets from files"), SecretFilesConfig)
    add_options(parser.add_argument_group("metrics"), MetricsPortConfig)
    add_options(parser.add_argument_group("TLS on the gateway's ports"), FrontTlsConfig)
    add_options(parser.add_argument_group("tracing (OpenTelemetry, OTLP gRPC)"), TracingConfig)
    add_options(parser.add_argument_group("worker discovery (DNS, Kubernetes)"), DiscoveryConfig)
    add_options(parser.add_argument_group("health checks"), HealthConfig)
    add_options(parser.add_argument_group("progress watchdog"), WatchdogConfig)
    add_options(parser.add_argument_group("resuming broken streams"), ResumeConfig)
    add_options(parser.add_argument_group("load polling"), LoadMonitorConfig)
    add_options(parser.add_argument_group("processes"), ProcessConfig)
    add_options(parser.add_argument_group("routing sync (NATS)"), SyncConfig)
    add_options(parser.add_argument_group("tool-call and reasoning parsers"), ParserConfig)
    add_options(parser.add_argument_group("stored responses and conversations"), HistoryConfig)
    add_options(parser.add_argument_group("MCP tools of Responses requests"), McpConfig)
    pd = parser.add_argument_group("prefill/decode disaggregation")
    pd.add_argument("--prefill", nargs="+", action="append", default=[], metavar="URL [BOOTSTRAP_PORT]",
                    help="prefill worker(s): grpc://host:port, each optionally followed by its bootstrap port "
                    "(default: learned from GetServerInfo); repeatable")
    pd.add_argument("--decode", nargs="+", action="append", default=[], metavar="URL",
                    help="decode worker(s): grpc://host:port; repeatable")
    add_options(pd, PdConfig)
    smg_compat.install(parser)  # it maps onto the flags above
    help_tiers.install(parser, OPERATOR_FLAGS)


# What ``serve --help`` lists: the flags an operator sets. Every other flag is a tuning
# knob, listed by ``--help-all`` and set the same ways (flag, environment, config file).
OPERATOR_FLAGS = (
    "--config",
    # workers and models
    "--worker-urls", "--prefill", "--decode", "--model", "--tokenizer-path", "--dns-workers", "--k8s-discovery",
    # routing
    "--policy",
    # ports and processes
    "--host", "--port", "--grpc-port", "--processes", "--sync-url",
    # keys and TLS
    "--api-keys", "--admin-api-key", "--worker-api-key", "--api-key-file", "--tls-cert-file", "--tls-key-file",
    "--worker-tls-ca-file",
    # limits
    "--max-concurrent-requests", "--max-queued-requests", "--rate-limit-per-s", "--max-body-bytes",
    "--max-prompt-tokens", "--request-timeout-s",
    # observability
    "--log-level", "--access-log", "--prometheus-port", "--metrics-access", "--otlp-traces-endpoint",
)  # fmt: skip


# --prefill/--decode are parsed by hand (URL [PORT] groups); in the environment and
# the config file they are lists of "URL [PORT]" strings.
POOL_FLAGS = ("prefill", "decode")


def _pool_extras() -> dict[str, Any]:
    from gateway.config_layers import Extra  # pydantic-settings: only when serving

    return {name: Extra(list[str], []) for name in POOL_FLAGS}


def resolve_settings(args: argparse.Namespace) -> dict[str, Any]:
    """Layer env and config file under the flags given; returns the flat settings."""
    from gateway.config_layers import resolve

    for name in POOL_FLAGS:
        groups = getattr(args, name, None) or []
        if groups:
            mark_explicit(args, name)
            setattr(args, name, [" ".join(g) for g in groups])
    values = resolve(args, config_file=args.config, extras=_pool_extras(), value_map=smg_compat.map_value)
    for name in POOL_FLAGS:
        # "none" is SMG's spelling of "no bootstrap port" (ours: learned from GetServerInfo)
        setattr(args, name, [[w for w in item.split() if w.lower() != "none"] for item in values[name]])
    return values


def config_from_args(args: argparse.Namespace) -> GatewayConfig:
    if not hasattr(args, "_settings"):
        args._settings = resolve_settings(args)
    server, security = apply_secret_files(
        from_namespace(SecretFilesConfig, args),
        from_namespace(ServerConfig, args),
        from_namespace(SecurityConfig, args),
    )
    discovery = from_namespace(DiscoveryConfig, args)
    try:
        check_discovery(discovery)
    except ValueError as exc:
        from gateway.config_layers import ConfigError

        raise ConfigError(str(exc)) from None
    return GatewayConfig(
        server=server,
        policy=from_namespace(PolicyConfig, args),
        engine=from_namespace(EngineConfig, args),
        retry=from_namespace(RetryConfig, args),
        dispatch=from_namespace(DispatchConfig, args),
        admission=from_namespace(AdmissionConfig, args),
        limits=from_namespace(LimitsConfig, args),
        security=security,
        health=from_namespace(HealthConfig, args),
        watchdog=from_namespace(WatchdogConfig, args),
        resume=from_namespace(ResumeConfig, args),
        load_monitor=from_namespace(LoadMonitorConfig, args),
        processes=from_namespace(ProcessConfig, args),
        sync=from_namespace(SyncConfig, args),
        metrics_port=from_namespace(MetricsPortConfig, args),
        tls=from_namespace(FrontTlsConfig, args),
        tracing=from_namespace(TracingConfig, args),
        discovery=discovery,
        http=from_namespace(HttpLimitsConfig, args),
        parsers=from_namespace(ParserConfig, args),
        history=from_namespace(HistoryConfig, args),
        mcp=from_namespace(McpConfig, args),
        pd=from_namespace(
            PdConfig, args,
            prefill=parse_pool_flags(args.prefill, allow_port=True),
            decode=parse_pool_flags(args.decode, allow_port=False),
        ),
    )


def setup_logging(level: str, as_json: bool) -> None:
    from gateway.observability.request_log import JsonFormatter, TextFormatter

    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if as_json else TextFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # Neither format names a line's source file, function, thread or process, so records skip
    # finding them (the logging HOWTO's "Optimization"): a walk up the caller's frames and a
    # few calls per line, and the access log writes a line per request.
    logging._srcfile = None
    logging.logThreads = False
    logging.logProcesses = False
    logging.logMultiprocessing = False


async def serve(config: GatewayConfig) -> None:
    from gateway.server.http.acceptor import AcceptingServer
    from gateway.server.http.app import create_app
    from gateway.server.http.guard import http_server_config
    from gateway.server.process_set import in_process_set, member_from_env
    from gateway.server.state import GatewayState

    check_startup(config.server.host, config.security)
    config.parsers.check()
    config.tls.check()
    # The port first: a busy or impossible one is a one-line error before any worker is probed.
    sock = socket.socket(socket.AF_INET6 if ":" in config.server.host else socket.AF_INET)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if in_process_set():  # one of serve --processes N: the set shares the port (see supervisor)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    try:
        sock.bind((config.server.host, config.server.port))
    except (OSError, OverflowError) as exc:
        sock.close()
        raise RuntimeError(f"cannot listen on {config.server.host}:{config.server.port}: {exc}") from None
    state = GatewayState(config)
    member = member_from_env(state.metrics.render)  # one of serve --processes N, or None
    await state.start()
    if member is not None:
        state.process_set = member
        state.metrics.federate = member.federate
        await member.start()
    app = create_app(state, manage_lifecycle=False)
    host, port = sock.getsockname()[:2]
    uv_config = http_server_config(
        app, config.http, access_log=False,
        # typed int, but uvicorn only hands it to asyncio.wait_for, which takes a float
        timeout_graceful_shutdown=max(0.1, config.server.shutdown_grace_s),  # type: ignore[arg-type]
        **config.tls.uvicorn_kwargs(),
    )
    server = AcceptingServer(uv_config)  # a burst of new connections is accepted in one loop turn
    handoff = None
    if member is not None and config.processes.process_parking == "auto" and not config.tls.enabled:
        from gateway.server.http.handoff import HandOff

        handoff = HandOff(member.run_dir, member.index)  # parked: new connections go to a sibling
        uv_config.http.handoff = handoff  # type: ignore[union-attr]
        from gateway.server.http.handoff import HandOffCollector

        state.metrics.registry.register(HandOffCollector(handoff))
    shown = f"[{host}]" if ":" in host else host
    scheme = "https" if config.tls.enabled else "http"
    ready = {"event": "ready", "url": f"{scheme}://{shown}:{port}", "workers": len(state.registry.all()),
             "models": state.model_names(), "policy": config.policy.policy}
    grpc_server = None
    if config.server.grpc_port is not None:
        from gateway.server.grpc.server import start_grpc_server

        grpc_server = await start_grpc_server(
            state, config.server.host, config.server.grpc_port, reuse_port=member is not None
        )
        ready["grpc_port"] = grpc_server.port
        ready["grpc_target"] = grpc_server.target
    from gateway.server.metrics_port import start_metrics_server

    metrics_port = config.metrics_port
    if member is not None and member.index != 0:  # in a set, process 0 serves it (for the whole set)
        metrics_port = dataclasses.replace(metrics_port, prometheus_port=None)
    metrics_server = await start_metrics_server(state.metrics, metrics_port, config.server.host)
    if metrics_server is not None:
        ready["metrics_url"] = metrics_server.url
    for entry in state.catalog.entries():  # models known at start-up: no request waits yet
        entry.tokenizer.build_merges()
    from gateway.pipeline.tokenizer_helper import TokenizerHelper

    state.catalog.tokenizer_helper = TokenizerHelper()  # the models that join from now on
    loop = asyncio.get_running_loop()
    grpc_stop: list[asyncio.Future[None]] = []
    serving = asyncio.ensure_future(server.serve(sockets=[sock]))
    # uvicorn exposes only a `started` flag, no event to wait on.
    while not server.started and not serving.done():  # noqa: ASYNC110
        await asyncio.sleep(0.01)
    if member is not None:
        from gateway.server.http.handoff import follow_supervisor

        on_active = None
        if handoff is not None:  # parking: this process's share of the set's limits follows the active ones
            import pickle

            from gateway.server.supervisor import CONFIG_FILE, active_admission

            whole = pickle.loads((member.run_dir / CONFIG_FILE).read_bytes()).admission  # the supervisor's file, mode 0600

            def on_active(active: list[int]) -> None:
                state.admission.resize(active_admission(whole, member.index, member.count, active))

        # before the ready line: the supervisor signals ready processes only
        follow_supervisor(member.run_dir, member.index, member.count, handoff,
                          lambda: server.server_state.connections, server.adopt, on_active)  # fmt: skip
    from gateway.server.gc_policy import tune_gc

    tune_gc(config.server.gc_young_threshold)  # everything alive now lives as long as the process
    print(orjson.dumps(ready).decode(), flush=True)

    def stop() -> None:
        # Graceful: new requests get 503 at once, uvicorn stops listening and gives
        # in-flight requests --shutdown-grace-s, then cancels them (which aborts their
        # worker requests). A second signal forces the exit.
        if server.should_exit:
            server.force_exit = True
            return
        log.info("shutting down: finishing in-flight requests (grace %.0f s)", config.server.shutdown_grace_s)
        state.admission.close()
        server.should_exit = True
        if grpc_server is not None:  # stop taking gRPC calls now; in-flight ones get the same grace
            grpc_stop.append(asyncio.ensure_future(grpc_server.stop(config.server.shutdown_grace_s)))

    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop)
    try:
        await serving
    finally:
        if grpc_server is not None:
            # in-flight gRPC calls share the same grace, then are cancelled (aborting their worker requests)
            await (grpc_stop[0] if grpc_stop else grpc_server.stop(config.server.shutdown_grace_s))
        if metrics_server is not None:
            await metrics_server.stop()
        await flush_aborts(2.0)
        if member is not None:
            await member.stop()
        if handoff is not None:
            handoff.close()
        await state.stop()


def print_config(args: argparse.Namespace) -> None:
    import yaml

    from gateway.config_layers import ENV_PREFIX, secret_names

    # Set secrets are left out (named in comments), so the output is a config file as it
    # stands: a masked value would be taken for the secret itself.
    secrets = secret_names(args, _pool_extras())
    held = [name for name, value in args._settings.items() if name in secrets and value]
    shown = {name: value for name, value in args._settings.items() if name not in held}
    print("# token-gateway serve: settings in effect (flag > env > file > default); usable as --config")
    for name in held:
        print(f"# {name}: set, not printed (give it as {ENV_PREFIX}{name.upper()} or with its --{name.replace('_', '-')} flag)")
    print(yaml.safe_dump(shown, sort_keys=False, default_flow_style=False), end="")


def run(args: argparse.Namespace) -> int:
    from gateway.config_layers import ConfigError

    try:
        config = config_from_args(args)
    except (PdFlagError, ConfigError, SecretFileError, ValueError) as exc:
        setup_logging("error", False)
        log.error("%s", exc)
        return 2
    if args.print_config:
        print_config(args)
        return 0
    setup_logging(config.server.log_level, config.server.log_json)
    smg_compat.warn_ignored(args)
    from gateway.config_layers import unknown_env

    for key in unknown_env(args, _pool_extras()):
        log.warning("environment variable %s is not a token-gateway setting (ignored)", key)
    try:
        processes = config.processes.count()
    except ValueError as exc:
        log.error("%s", exc)
        return 2
    if processes > 1:
        from gateway.server.supervisor import run_set

        return run_set(config, processes)
    return run_config(config)


def run_config(config: GatewayConfig) -> int:
    """Run one serving process (the whole gateway, or one of a supervisor's set)."""
    from gateway.observability.heap_trace import install_from_env

    install_from_env()  # no-op unless TOKEN_GATEWAY_TRACEMALLOC_DIR is set
    if not (config.server.worker_urls or config.pd.prefill or config.pd.decode):
        log.warning("no workers yet: /readiness answers 503 until one is registered with POST /workers")
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    try:
        asyncio.run(serve(config))
    except KeyboardInterrupt:
        return 0
    except (InsecureAdminError, TlsConfigError) as exc:
        log.error("%s", exc)
        return 2
    except RuntimeError as exc:
        log.error("%s", exc)
        return 1
    return 0


def child_main() -> int:
    """One serving process of the set (the supervisor runs ``python -m gateway.server.serve``)."""
    import os
    import pickle
    from pathlib import Path

    from gateway.server.process_set import ENV_COUNT, ENV_INDEX, ENV_RUN_DIR
    from gateway.server.supervisor import CONFIG_FILE, share_admission

    run_dir = Path(os.environ[ENV_RUN_DIR])
    index, count = int(os.environ[ENV_INDEX]), int(os.environ[ENV_COUNT])
    config: GatewayConfig = pickle.loads((run_dir / CONFIG_FILE).read_bytes())  # our own file, mode 0600
    config = dataclasses.replace(config, admission=share_admission(config.admission, index, count))
    setup_logging(config.server.log_level, config.server.log_json)
    return run_config(config)


if __name__ == "__main__":
    sys.exit(child_main())
