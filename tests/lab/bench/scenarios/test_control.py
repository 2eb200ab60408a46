"""`token-gateway bench control` (gateway_lab.bench.scenarios.control): the admission
phase's three measurements on a tiny run, and the two sub-commands' flags."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from gateway_lab.bench.scenarios import control as scenario


def _parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    scenario.add_arguments(parser)
    return parser.parse_args(list(argv))


async def test_the_admission_phase_measures_three_paths() -> None:
    result = await scenario.admission(_parse("admission", "--requests", "512"))
    assert result["requests"] == 512
    for key in ("uncontended_us", "queued_cap8_256_waiting_us", "rate_limited_100_keys_us"):
        assert result[key] > 0


def test_flags_of_both_sub_commands() -> None:
    failover = _parse("failover", "--workers", "2", "--kill-at", "1")
    assert (failover.what, failover.workers, failover.kill_at, failover.policy) == ("failover", 2, 1.0, "round_robin")
    with pytest.raises(SystemExit):
        _parse()  # a sub-command is required


def test_main_writes_a_phase_in_the_common_format(tmp_path: Path) -> None:
    parser = argparse.ArgumentParser()
    scenario.add_arguments(parser)
    out = tmp_path / "c.json"
    assert scenario.main(parser.parse_args(["admission", "--requests", "512", "--json", str(out)])) == 0
    written = json.loads(out.read_text())
    assert written["requests"] == 512 and written["uncontended_us"] > 0
    assert [r["figure"] for r in written["rows"]][:2] == ["requests", "uncontended_us"]
    table = scenario.result("failover", {"errors_after_kill": {"stream_error": 2}, "kill_at_s": 4.0}).tables[0]
    assert table.rows == (("errors_after_kill", '{"stream_error": 2}'), ("kill_at_s", "4.0"))
