"""`token-gateway bench SUB ...`: the benchmark sub-commands.

* ``run``: drive a workload through running gateways (``bench/cli.py``, also
  ``python -m gateway.bench``);
* ``matrix``: every policy on every workload against simulated fleets of several
  sizes, with the oracle and optional peers (``bench/matrix.py``);
* ``trace``: a public trace (Mooncake's format, or JSONL prompts with timestamps)
  through each policy on two differently built fleets (``bench/trace_bench.py``);
* ``elastic``: workers added and removed under load, steady run beside it (``bench/elastic.py``).

Each sub-command module exposes ``add_arguments(parser)`` and ``run(args)``, like the
top-level commands; add a new one to ``SUBCOMMANDS``.
"""

from __future__ import annotations

import argparse
import importlib

SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "run": ("gateway.bench.cli", "drive a workload through running gateways and compare them"),
    "matrix": ("gateway.bench.matrix", "every policy x workload x fleet size on simulated fleets (+ oracle, peers)"),
    "trace": ("gateway.bench.trace_bench", "replay a public trace through each policy on two fleet builds, with its ideals"),
    "elastic": ("gateway.bench.elastic", "a fleet growing and shrinking under load: time to fair share, hit rate"),
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="bench_command", required=True, metavar="SUB")
    for name, (module, help_text) in SUBCOMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text, formatter_class=parser.formatter_class)
        p.set_defaults(_bench_module=module)
        importlib.import_module(module).add_arguments(p)


def run(args: argparse.Namespace) -> int:
    return int(importlib.import_module(args._bench_module).run(args) or 0)
