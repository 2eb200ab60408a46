"""`token-gateway` command line: one sub-command per job.

Each sub-command lives in its own module exposing ``add_arguments(parser)`` and
``run(args) -> int``; this file only wires them up. Command modules keep
their top-level imports light (heavy ones go inside ``run``) so that building
the parser stays fast.

The gateway's own commands are listed here. Other installed packages add theirs
through the ``token_gateway.commands`` entry-point group (the lab's ``sim-worker``,
``demo`` and ``bench``): the gateway never imports them by name, and a command line
naming one command loads only that command's module, so ``serve`` never loads the lab.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import MutableMapping
from importlib import metadata

# name -> (module, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "serve": ("gateway.server.serve", "run the gateway: OpenAI HTTP front door over SGLang gRPC workers"),
    "inspect": ("gateway.inspect_cli", "show what the router sees in a prompt: tokens, block hashes, ring owner, cached tokens"),
}
# Installed packages register more commands here: name = "package.module" (with HELP and
# the two functions above).
COMMAND_GROUP = "token_gateway.commands"


def added_commands() -> dict[str, str]:
    """name -> module of the commands other installed packages register (never the built-in names)."""
    return {ep.name: ep.value for ep in metadata.entry_points(group=COMMAND_GROUP) if ep.name not in COMMANDS}


def chosen_command(argv: list[str]) -> str | None:
    """The command a command line names (its first word that is not an option), if any."""
    return next((word for word in argv if not word.startswith("-")), None)


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


def build_parser(argv: list[str] | None = None) -> argparse.ArgumentParser:
    """The parser of every command; given the command line, only of the command it names.

    Without ``argv`` (or when it names no known command, e.g. bare ``--help``) every
    command module is loaded, the registered ones included."""
    parser = argparse.ArgumentParser(
        prog="token-gateway",
        description="Token-level routing gateway for SGLang gRPC workers.",
        formatter_class=_HelpFormatter,
    )
    parser.add_argument("--version", action="version", version=version_text())
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    modules = {name: module for name, (module, _) in COMMANDS.items()} | added_commands()
    chosen = chosen_command(argv) if argv is not None else None
    if chosen in modules:
        modules = {chosen: modules[chosen]}
    for name, module_name in modules.items():
        module = importlib.import_module(module_name)
        help_text = COMMANDS[name][1] if name in COMMANDS else str(getattr(module, "HELP", ""))
        p = sub.add_parser(name, help=help_text, description=help_text, formatter_class=_HelpFormatter)
        p.set_defaults(_module=module_name)
        module.add_arguments(p)
    return parser


# gRPC core reads GRPC_EXPERIMENTS once, when ``grpc`` is first imported, so it is set
# here, before any command module imports it. The EventEngine client (grpcio's default
# since 1.6x) hands every received message through its own threads before the asyncio
# poller sees it; the classic client reads in the poller thread. Relaying a worker's
# token stream, the classic path costs markedly less CPU per message (measured with
# `token-gateway bench overhead`; the figures are in docs/journal/). The same holds for the
# listener of the gRPC front door. An operator's own GRPC_EXPERIMENTS (even empty:
# gRPC's defaults) wins.
GRPC_EXPERIMENTS = "-event_engine_client,-event_engine_listener"


def apply_grpc_defaults(environ: MutableMapping[str, str] = os.environ) -> str:
    """Set gRPC core's experiment list unless the operator did; returns what is in effect."""
    return environ.setdefault("GRPC_EXPERIMENTS", GRPC_EXPERIMENTS)


def main(argv: list[str] | None = None) -> int:
    apply_grpc_defaults()
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser(argv).parse_args(argv)
    return int(importlib.import_module(args._module).run(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
