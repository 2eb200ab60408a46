"""`token-gateway` top level: --version, --help without doubled or empty defaults, and
``serve``'s two help tiers."""

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


@pytest.mark.parametrize(
    "args", [[c, "--help"] for c in [*COMMANDS, *added_commands()]] + [["serve", "--help-all"]]
)
def test_help_defaults_once_and_never_empty(args: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(args)
    text = re.sub(r"\s+", " ", capsys.readouterr().out)
    assert "(default: )" not in text
    assert "(default: None)" not in text
    assert "(default: [])" not in text
    assert not re.search(r"\(default: [^)]*\) \(default:", text), text


def _flags(argv: list[str], capsys: pytest.CaptureFixture[str]) -> set[str]:
    with pytest.raises(SystemExit) as exit_info:
        build_parser().parse_args(argv)
    assert exit_info.value.code == 0
    return set(re.findall(r"^  (--[a-z0-9-]+)", capsys.readouterr().out, re.MULTILINE))


def test_serve_help_shows_the_operators_flags_and_help_all_every_knob(capsys: pytest.CaptureFixture[str]) -> None:
    from gateway.server.serve import OPERATOR_FLAGS

    short = _flags(["serve", "--help"], capsys)
    every = _flags(["serve", "--help-all"], capsys)
    assert short == {*OPERATOR_FLAGS, "--help-all"}  # and -h, --help
    assert 25 <= len(OPERATOR_FLAGS) <= 34
    for flag in ("--worker-urls", "--policy", "--port", "--grpc-port", "--api-keys", "--max-concurrent-requests",
                 "--tls-cert-file", "--processes", "--prometheus-port", "--otlp-traces-endpoint", "--log-level"):
        assert flag in short, flag
    assert short < every and len(every) > 4 * len(short)
    assert {"--hot-prefix-window", "--watchdog-learn-alpha", "--sync-flush-interval-s"} <= every - short


def test_serve_knobs_outside_the_short_help_still_parse_with_unchanged_defaults() -> None:
    parser = build_parser()
    defaults = parser.parse_args(["serve"])
    tuned = parser.parse_args(["serve", "--hot-prefix-window", "77", "--watchdog-learn-alpha", "0.5"])
    assert (tuned.hot_prefix_window, tuned.watchdog_learn_alpha) == (77, 0.5)
    from gateway.policies.factory import PolicyConfig

    assert defaults.hot_prefix_window == PolicyConfig().hot_prefix_window


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
