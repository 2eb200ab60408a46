"""`token-gateway` command line: one sub-command per job.

Each sub-command lives in its own module exposing ``add_arguments(parser)`` and
``run(args) -> int``; this file only wires them up. Command modules keep
their top-level imports light (heavy ones go inside ``run``) so that building
the parser, which imports every command module, stays fast.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import MutableMapping

# name -> (module, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "serve": ("gateway.server.serve", "run the gateway: OpenAI HTTP front door over SGLang gRPC workers"),
    "sim-worker": ("gateway_lab.sim.cli", "run one simulated SGLang --grpc-mode worker"),
    "inspect": ("gateway.inspect_cli", "show what the router sees in a prompt: tokens, block hashes, ring owner, cached tokens"),
    "demo": ("gateway_lab.demo", "run the shared-prefix demo: simulated fleet + gateway + workload, per policy"),
    "bench": ("gateway_lab.bench.commands", "benchmarks: drive running gateways (run), the policy x workload x fleet matrix"),
}


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """Shows every default in --help once and keeps description line breaks.

    A default is not appended when the help text already says what it is
    ("(default: what workers report)") or when there is none to show (unset, empty)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if "(default" in text or "%(default)" in text:
            return text
        default = action.default
        if default is None or default is argparse.SUPPRESS or default in ("", [], ()):
            return text
        if action.option_strings and action.nargs != 0:
            if isinstance(default, list | tuple):
                return text + " (default: " + " ".join(str(v) for v in default) + ")"
            return text + " (default: %(default)s)"
        return super()._get_help_string(action) or text


def version_text() -> str:
    from importlib import metadata

    from gateway import __version__

    try:
        installed = metadata.version("token-gateway")
    except metadata.PackageNotFoundError:
        installed = __version__
    return f"token-gateway {installed}"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="token-gateway",
        description="Token-level routing gateway for SGLang gRPC workers.",
        formatter_class=_HelpFormatter,
    )
    parser.add_argument("--version", action="version", version=version_text())
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (module, help_text) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text, formatter_class=_HelpFormatter)
        p.set_defaults(_module=module)
        importlib.import_module(module).add_arguments(p)
    return parser


# gRPC core reads GRPC_EXPERIMENTS once, when ``grpc`` is first imported, so it is set
# here, before any command module imports it. The EventEngine client (grpcio's default
# since 1.6x) hands every received message through its own threads before the asyncio
# poller sees it; the classic client reads in the poller thread. Relaying a worker's
# token stream, the classic path costs about a third less CPU per message (grpcio 1.85,
# uvloop: 21-23 against 13-15 µs; docs/BENCHMARKS.md, issue 18). The same holds for the
# listener of the gRPC front door. An operator's own GRPC_EXPERIMENTS (even empty:
# gRPC's defaults) wins.
GRPC_EXPERIMENTS = "-event_engine_client,-event_engine_listener"


def apply_grpc_defaults(environ: MutableMapping[str, str] = os.environ) -> str:
    """Set gRPC core's experiment list unless the operator did; returns what is in effect."""
    return environ.setdefault("GRPC_EXPERIMENTS", GRPC_EXPERIMENTS)


def main(argv: list[str] | None = None) -> int:
    apply_grpc_defaults()
    args = build_parser().parse_args(argv)
    return int(importlib.import_module(args._module).run(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
