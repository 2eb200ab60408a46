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


def _entries() -> list[tuple[str, str]]:
    named = [(module, "run") for module, _ in SUBCOMMANDS.values()] + [("gateway_lab.demo", "run")]
    return named + [(f"gateway_lab.bench.scenarios.{module}", "main") for module, _ in SCENARIOS.values()]


@pytest.mark.parametrize(("module", "entry"), _entries())
def test_every_benchmark_exits_by_the_one_rule(module: str, entry: str) -> None:
    """A benchmark's exit status is its result's (``results.write`` / ``Result.exit_status``,
    non-zero when the run is invalid), never a constant after the figures are written."""
    import ast
    import inspect

    source = inspect.getsource(importlib.import_module(module))
    (func,) = [n for n in ast.parse(source).body if isinstance(n, ast.FunctionDef) and n.name == entry]
    last = func.body[-1]
    assert isinstance(last, ast.Return) and last.value is not None
    assert not isinstance(last.value, ast.Constant), f"{module}.{entry} ends by returning a constant"
