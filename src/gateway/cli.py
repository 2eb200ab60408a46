"""`token-gateway` command line: one sub-command per job.

Each sub-command lives in its own module exposing ``add_arguments(parser)`` and
``run(args) -> int``; this file only wires them up. Command modules keep
their top-level imports light (heavy ones go inside ``run``) so that building
the parser, which imports every command module, stays fast.
"""

from __future__ import annotations

import argparse
import importlib
import sys

# name -> (module, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "serve": ("gateway.server.serve", "run the gateway: OpenAI HTTP front door over SGLang gRPC workers"),
    "sim-worker": ("gateway.sim.cli", "run one simulated SGLang --grpc-mode worker"),
    "inspect": ("gateway.inspect_cli", "show what the router sees in a prompt: tokens, block hashes, ring owner, cached tokens"),
    "demo": ("gateway.demo", "run the shared-prefix demo: simulated fleet + gateway + workload, per policy"),
    "bench": ("gateway.bench.commands", "benchmarks: drive running gateways (run), the policy x workload x fleet matrix"),
}


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """Shows every default in --help and keeps description line breaks."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="token-gateway",
        description="Token-level routing gateway for SGLang gRPC workers.",
        formatter_class=_HelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (module, help_text) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text, formatter_class=_HelpFormatter)
        p.set_defaults(_module=module)
        importlib.import_module(module).add_arguments(p)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(importlib.import_module(args._module).run(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
