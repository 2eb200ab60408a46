"""``python -m gateway_lab.bench``: drive a workload through running gateways (see bench/cli.py)."""

import argparse
import sys

from gateway_lab.bench import cli


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """Shows every default and keeps the description's line breaks."""


parser = argparse.ArgumentParser(
    prog="python -m gateway_lab.bench", description=cli.__doc__, formatter_class=_HelpFormatter
)
cli.add_arguments(parser)
sys.exit(cli.run(parser.parse_args()))
