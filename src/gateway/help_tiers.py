"""Tiered ``--help``: the operator's flags by default, every tuning knob with ``--help-all``.

A command with many knobs (``serve``) shows the handful an operator sets (workers,
policy, ports, keys, limits, TLS, processes, observability) under ``--help``; the
rest stay flags, config-file keys and environment variables as before, and
``--help-all`` lists them all, grouped. Only the help text is tiered: parsing,
defaults and the settings' layers do not change.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterable, Sequence
from typing import Any


class TieredHelp(argparse.Action):
    """Print the parser's help and exit; ``shown``: the only flags listed (None: all)."""

    def __init__(self, option_strings: Sequence[str], dest: str = argparse.SUPPRESS, *,
                 shown: frozenset[str] | None, help: str | None = None) -> None:
        super().__init__(option_strings, dest=dest, default=argparse.SUPPRESS, nargs=0, help=help)
        self.shown = shown

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        parser.print_help() if self.shown is None else print(operator_help(parser, self.shown), end="")
        parser.exit()


def _is_listed(action: argparse.Action, shown: frozenset[str]) -> bool:
    return not action.option_strings or isinstance(action, TieredHelp) or bool(shown & set(action.option_strings))


def operator_help(parser: argparse.ArgumentParser, shown: frozenset[str]) -> str:
    """The help of ``parser`` with only the flags in ``shown`` (groups left empty drop out)."""
    hidden = [a for a in parser._actions if a.help is not argparse.SUPPRESS and not _is_listed(a, shown)]
    saved = [a.help for a in hidden]
    for action in hidden:
        action.help = argparse.SUPPRESS
    try:
        return parser.format_help()
    finally:
        for action, text in zip(hidden, saved, strict=True):
            action.help = text


def install(parser: argparse.ArgumentParser, operator_flags: Iterable[str]) -> None:
    """Make ``-h/--help`` list ``operator_flags`` only and add ``--help-all``.

    Raises ValueError naming any of ``operator_flags`` the parser does not have (a
    renamed flag must not silently drop out of the operator's help)."""
    shown = frozenset(operator_flags)
    known = {s for a in parser._actions for s in a.option_strings}
    missing = sorted(shown - known)
    if missing:
        raise ValueError(f"operator flags the parser does not have: {missing}")
    group = parser._optionals  # where argparse put its own -h/--help
    handler = group.conflict_handler
    group.conflict_handler = "resolve"  # the new -h/--help replaces argparse's own
    try:
        group.add_argument("-h", "--help", action=TieredHelp, shown=shown,
                           help="show the operator's flags and exit (every tuning knob: --help-all)")
    finally:
        group.conflict_handler = handler
    group.add_argument("--help-all", action=TieredHelp, shown=None, help="show every flag, grouped, and exit")
    parser.epilog = (parser.epilog + "\n\n" if parser.epilog else "") + EPILOG


EPILOG = (
    "--help lists the flags an operator sets; --help-all lists every tuning knob too. Each flag\n"
    "is also a key of the --config file and a TOKEN_GATEWAY_<FLAG> environment variable."
)
