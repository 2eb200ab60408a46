"""`token-gateway bench store` (gateway_lab.bench.scenarios.store): one tiny real run of
each embedded backend, and a PostgreSQL one when a server can be started."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from gateway.pipeline.store.memory import MemoryStore
from gateway.pipeline.store.sqlite import SqliteStore
from gateway_lab.bench.scenarios import store as scenario


async def test_a_tiny_run_of_each_backend(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for name, backend in (("memory", MemoryStore()), ("sqlite", SqliteStore(tmp_path / "h.sqlite3"))):
        wall, cpu = await scenario.measure(name, backend, 3)
        assert wall > 0 and cpu >= 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in lines] == ["memory", "sqlite"] and all("CPU/round" in line for line in lines)


def test_flags() -> None:
    parser = argparse.ArgumentParser()
    scenario.add_arguments(parser)
    args = parser.parse_args(["--rounds", "5"])
    assert (args.rounds, args.dsn) == (5, None)


def test_main_writes_one_row_per_backend(tmp_path: Path) -> None:
    parser = argparse.ArgumentParser()
    scenario.add_arguments(parser)
    out = tmp_path / "s.json"
    assert scenario.main(parser.parse_args(["--rounds", "2", "--json", str(out)])) == 0
    written = json.loads(out.read_text())
    assert [r["backend"] for r in written["rows"]] == ["memory", "sqlite"] and written["sqlite"]["wall_s_per_round"] > 0
