"""`token-gateway bench SUB`: every scenario is a sub-command with its own flags and help."""

from __future__ import annotations

import importlib

import pytest

from gateway.cli import build_parser
from gateway_lab.bench.commands import SCENARIOS, SUBCOMMANDS


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_every_scenario_has_its_help(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        build_parser(["bench", name, "--help"]).parse_args(["bench", name, "--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: token-gateway bench {name}")
    module = importlib.import_module(f"gateway_lab.bench.scenarios.{SCENARIOS[name][0]}")
    assert module.__doc__ and module.__doc__.splitlines()[0] in out


def test_a_scenario_runs_through_its_main() -> None:
    args = build_parser().parse_args(["bench", "policies", "micro", "--requests", "5"])
    assert args._bench_module == "gateway_lab.bench.scenarios.policies"
    assert (args._bench_entry, args.what, args.requests) == ("main", "micro", 5)
    args = build_parser().parse_args(["bench", "matrix"])
    assert (args._bench_module, args._bench_entry) == (SUBCOMMANDS["matrix"][0], "run")


def test_scenario_names_do_not_shadow_the_drivers() -> None:
    assert not set(SCENARIOS) & set(SUBCOMMANDS)
