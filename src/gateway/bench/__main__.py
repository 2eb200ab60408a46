"""``python -m gateway.bench``: drive a workload through running gateways (see bench/cli.py)."""

import argparse
import sys

from gateway.bench import cli

parser = argparse.ArgumentParser(
    prog="python -m gateway.bench",
    description=cli.__doc__,
    formatter_class=type("F", (argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter), {}),
)
cli.add_arguments(parser)
sys.exit(cli.run(parser.parse_args()))
