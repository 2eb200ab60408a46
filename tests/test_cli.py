"""`token-gateway` top level: --version, and --help without doubled or empty defaults."""

from __future__ import annotations

import re

import pytest

from gateway import __version__
from gateway.cli import COMMANDS, added_commands, build_parser


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        build_parser().parse_args(["--version"])
    assert exit_info.value.code == 0
    assert capsys.readouterr().out.strip() == f"token-gateway {__version__}"


@pytest.mark.parametrize("command", [*COMMANDS, *added_commands()])
def test_help_defaults_once_and_never_empty(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args([command, "--help"])
    text = re.sub(r"\s+", " ", capsys.readouterr().out)
    assert "(default: )" not in text
    assert "(default: None)" not in text
    assert "(default: [])" not in text
    assert not re.search(r"\(default: [^)]*\) \(default:", text), text


def test_grpc_defaults_are_set_unless_the_operator_chose() -> None:
    from gateway.cli import GRPC_EXPERIMENTS, apply_grpc_defaults

    env: dict[str, str] = {}
    assert apply_grpc_defaults(env) == GRPC_EXPERIMENTS
    assert env["GRPC_EXPERIMENTS"] == GRPC_EXPERIMENTS
    chosen = {"GRPC_EXPERIMENTS": ""}  # empty: gRPC's own defaults
    assert apply_grpc_defaults(chosen) == ""
    assert chosen == {"GRPC_EXPERIMENTS": ""}


def test_the_cli_sets_grpc_experiments_before_grpc_is_imported() -> None:
    """gRPC reads the variable at import: the command line must set it first."""
    import subprocess
    import sys

    code = (
        "import os, sys\n"
        "os.environ.pop('GRPC_EXPERIMENTS', None)\n"
        "import gateway.cli as cli\n"
        "assert 'grpc' not in sys.modules, 'importing the CLI imported grpc'\n"
        "try:\n"
        "    cli.main(['serve', '--help'])\n"
        "except SystemExit:\n"
        "    pass\n"
        "print(os.environ['GRPC_EXPERIMENTS'])\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    from gateway.cli import GRPC_EXPERIMENTS

    assert out.stdout.strip().splitlines()[-1] == GRPC_EXPERIMENTS


def test_the_lab_commands_are_registered_and_serve_does_not_load_them() -> None:
    """sim-worker, demo and bench come from gateway_lab's entry points; serve never imports the lab."""
    import subprocess
    import sys

    from gateway.cli import added_commands

    assert added_commands() == {
        "sim-worker": "gateway_lab.sim.cli",
        "demo": "gateway_lab.demo",
        "bench": "gateway_lab.bench.commands",
    }
    code = (
        "import sys\n"
        "import gateway.cli as cli\n"
        "try:\n"
        "    cli.main(['serve', '--help'])\n"
        "except SystemExit:\n"
        "    pass\n"
        "print(sorted(m for m in sys.modules if m.startswith('gateway_lab')))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip().splitlines()[-1] == "[]"


def test_a_command_line_builds_only_its_command() -> None:
    from gateway.cli import build_parser, chosen_command

    assert chosen_command(["--version"]) is None
    assert chosen_command(["sim-worker", "--port", "0"]) == "sim-worker"
    parser = build_parser(["sim-worker", "--help"])
    commands = parser._subparsers._group_actions[0].choices  # type: ignore[union-attr]
    assert list(commands) == ["sim-worker"]
    assert set(build_parser()._subparsers._group_actions[0].choices) >= {  # type: ignore[union-attr]
        "serve", "inspect", "sim-worker", "demo", "bench",
    }
