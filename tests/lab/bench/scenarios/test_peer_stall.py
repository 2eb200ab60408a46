"""`token-gateway bench peer-stall` (gateway_lab.bench.scenarios.peer_stall): the figures it
prints, and a clear exit when SMG is not installed (tests/lab/sim/test_independent_clients.py
runs SMG itself when it is)."""

from __future__ import annotations

import argparse

import pytest

from gateway_lab.bench.scenarios.peer_stall import add_arguments, main, result, summarize


def test_summarize_gives_count_wall_and_percentiles() -> None:
    figures = summarize([0.05] * 98 + [5.0, 5.1], wall_s=6.2345)
    assert figures == {"requests": 100, "wall_s": 6.234, "p50_ms": 50.0, "p99_ms": 5000.0, "max_ms": 5100.0}


def test_a_missing_peer_is_a_clear_exit(tmp_path) -> None:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(["--python", str(tmp_path / "nope" / "python")])
    with pytest.raises(SystemExit, match=r"scripts/peers\.sh"):
        main(args)


def test_the_figures_are_one_row_and_stay_at_the_jsons_top_level() -> None:
    figures = summarize([0.05] * 98 + [5.0, 5.1], wall_s=6.2345)
    out = result(figures, 4)
    assert out.tables[0].rows == (("smg", "100", "6.234 s", "50.0 ms", "5000.0 ms", "5100.0 ms"),)
    written = out.to_json()
    assert written["p99_ms"] == 5000.0 and written["rows"][0]["p50"] == "50.0 ms"
