"""`token-gateway sim-worker`: host N simulated SGLang workers in one process.

Prints one JSON line ``{"event": "ready", "urls": [...], "bootstrap_ports": [...]}``
on stdout once every worker listens, and on SIGTERM/SIGINT (or normal stop)
one line ``{"event": "counters", "workers": [...]}`` with each worker's totals.
Imports stay light here; the worker machinery is imported inside ``run``.
"""

from __future__ import annotations

import argparse

from gateway.settings import add_options, from_namespace
from gateway_lab.sim.config import ROLES, SimConfig

HELP = "run one simulated SGLang --grpc-mode worker"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    hosting = parser.add_argument_group("hosting")
    hosting.add_argument("--host", default="127.0.0.1", help="address to listen on")
    hosting.add_argument(
        "--port", type=int, default=0, help="gRPC port of the first worker (0: ephemeral ports)"
    )
    hosting.add_argument(
        "--num-workers", type=int, default=1, help="independent workers on consecutive ports"
    )
    hosting.add_argument(
        "--engine", choices=["sglang", "vllm", "trtllm"], default="sglang",
        help="gRPC mode: serve SGLang's scheduler service (--grpc-mode), vLLM's engine service or TensorRT-LLM's",
    )
    hosting.add_argument(
        "--http", action="store_true",
        help="serve HTTP (http:// URLs) instead of --grpc-mode gRPC, with the API of --http-api",
    )
    hosting.add_argument(
        "--http-api", choices=["sglang", "vllm"], default="sglang",
        help="with --http: SGLang's native API or vLLM's OpenAI server (token-id prompts)",
    )
    hosting.add_argument(
        "--roles",
        nargs="*",
        choices=ROLES,
        default=None,
        help="per-worker roles, overriding --role (one per worker)",
    )
    add_options(parser.add_argument_group("worker"), SimConfig)


# gRPC core's EventEngine listener hands every read of a served connection to its own
# threads; the classic poller reads in the completion-queue thread. For a process that
# only serves small RPCs (zero-cost workers in the scale-out benchmark) the classic path
# costs less CPU per RPC (measured with grpcio; the figures are in docs/journal/). An
# experiment list set by the operator wins.
GRPC_EXPERIMENTS = "-event_engine_listener"


def run(args: argparse.Namespace) -> int:
    import asyncio
    import os

    os.environ.setdefault("GRPC_EXPERIMENTS", GRPC_EXPERIMENTS)  # read at gRPC's first server start

    config = from_namespace(SimConfig, args)
    if args.num_workers < 1:
        raise SystemExit("--num-workers must be >= 1")
    if args.roles and len(args.roles) != args.num_workers:
        raise SystemExit(f"--roles names {len(args.roles)} roles for {args.num_workers} workers")
    try:  # the gateway's event loop too: a cheaper loop turn for every RPC a worker serves
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    return asyncio.run(_serve(config, args))


async def _serve(config: SimConfig, args: argparse.Namespace) -> int:
    import asyncio
    import dataclasses
    import gc
    import json
    import signal
    import sys

    from gateway_lab.sim.http_server import SimHttpWorker
    from gateway_lab.sim.vocab import load_vocab
    from gateway_lab.sim.worker import SimWorker, exit_process

    load_vocab(config.tokenizer_path, config.output_vocab)  # fail early on a bad path
    workers: list[SimWorker | SimHttpWorker] = []
    for i in range(args.num_workers):
        cfg = config if not args.roles else dataclasses.replace(config, role=args.roles[i])
        if args.http:
            workers.append(SimHttpWorker(cfg, on_die=exit_process, api=args.http_api))
        else:
            workers.append(SimWorker(cfg, on_die=exit_process, engine=args.engine))
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        for i, w in enumerate(workers):
            port = args.port + i if args.port else 0
            bport = config.bootstrap_port + i if config.bootstrap_port else 0
            await w.start(args.host, port, bootstrap_port=bport)
        ready = {
            "event": "ready",
            "urls": [w.url for w in workers],
            "bootstrap_ports": [w.bootstrap_port for w in workers],
            "roles": [w.config.role for w in workers],
        }
        # The vocabulary and the workers live as long as the process: keep them out of
        # every full garbage collection (each would walk ~150k vocabulary objects).
        gc.collect()
        gc.freeze()
        print(json.dumps(ready), flush=True)
        await stop.wait()
    finally:
        await asyncio.gather(*(w.stop(grace=0.5) for w in workers), return_exceptions=True)
        print(
            json.dumps({"event": "counters", "workers": [w.stats() for w in workers]}), flush=True
        )
        sys.stdout.flush()
    return 0
