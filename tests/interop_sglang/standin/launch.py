"""Start SGLang's own server (``--grpc-mode`` or HTTP) with the stand-in scheduler.

    .interop-venv/bin/python -m tests.interop_sglang.standin.launch --model-path DIR \\
        --device cpu --grpc-mode --port 34010

Takes SGLang's ``launch_server`` arguments unchanged. Before SGLang starts, the
per-rank scheduler process it would spawn is replaced with
``scheduler.run_standin_scheduler``: in gRPC mode through the servicer's
launcher module (its process target), in HTTP mode through the argument
``launch_server`` offers for it. Everything else is SGLang's and the
servicer's own code.
"""

from __future__ import annotations

import os
import sys


def main(argv: list[str]) -> None:
    from sglang.launch_server import run_server
    from sglang.srt.plugins import load_plugins
    from sglang.srt.server_args import prepare_server_args
    from sglang.srt.utils import kill_process_tree

    from tests.interop_sglang.standin.scheduler import run_standin_scheduler

    load_plugins()
    server_args = prepare_server_args(argv)
    if server_args.smg_grpc_mode or server_args.grpc_mode:
        from smg_grpc_servicer.sglang import scheduler_launcher

        scheduler_launcher.run_scheduler_with_signal_handling = run_standin_scheduler
    else:
        from sglang.srt.entrypoints import http_server

        original = http_server.launch_server

        def launch_with_standin(args, *rest, **kw):  # type: ignore[no-untyped-def]
            kw["run_scheduler_process_func"] = run_standin_scheduler
            return original(args, *rest, **kw)

        http_server.launch_server = launch_with_standin
    try:
        run_server(server_args)
    finally:
        kill_process_tree(os.getpid(), include_parent=False)


if __name__ == "__main__":
    main(sys.argv[1:])
