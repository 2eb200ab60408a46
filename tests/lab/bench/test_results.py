"""The one result format (gateway_lab/bench/results.py): a table's rows must fit its header,
the JSON carries the machine, the rows by header and the scenario's own figures, and the
writer prints tables, notes and the machine line and writes Markdown and JSON."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from rich.console import Console

from gateway_lab.bench.results import Result, Table, rich_table, write


def _result() -> Result:
    table = Table.of("trace x", ["fleet", "policy", "hit"], [["sim", "cache_aware", "61.0%"], ["sim", "rr", "[1/2]"]])
    return Result([table], ["sim: ideal 80%"], {"cells": [{"policy": "cache_aware"}]}, machine={"cpus": 2})


def test_a_row_that_does_not_fit_its_header_is_refused() -> None:
    with pytest.raises(ValueError, match="a row of 2 cells under 3 columns"):
        Table.of("t", ["a", "b", "c"], [["1", "2"]])


def test_json_has_the_machine_the_rows_by_header_and_the_scenarios_figures() -> None:
    data = _result().to_json()
    assert data["machine"]["cpus"] == 2 and len(data["machine"]["load_avg_end"]) == 3
    assert data["rows"][0] == {"fleet": "sim", "policy": "cache_aware", "hit": "61.0%"}
    assert data["cells"] == [{"policy": "cache_aware"}]
    two = Result([Table.of("a", ["x"], [["1"]]), Table.of("b", ["y"], [["2"]])], machine={})
    assert two.to_json()["rows"] == {"a": [{"x": "1"}], "b": [{"y": "2"}]}


def test_markdown_is_each_table_then_the_notes() -> None:
    assert _result().markdown().splitlines() == [
        "| fleet | policy | hit |", "|---|---|---|", "| sim | cache_aware | 61.0% |", "| sim | rr | [1/2] |",
        "", "sim: ideal 80%",
    ]  # fmt: skip
    two = Result([Table.of("a", ["x"], [["1"]]), Table.of("b", ["y"], [["2"]])], machine={})
    assert two.markdown().splitlines()[:3] == ["#### a", "", "| x |"] and "#### b" in two.markdown()


def test_the_writer_prints_everything_and_writes_both_files(tmp_path: Path) -> None:
    out = io.StringIO()
    write(_result(), Console(file=out, width=120), json_path=tmp_path / "r.json", markdown_path=tmp_path / "r.md")
    text = out.getvalue()
    assert text.index("cache_aware") < text.index("ideal 80%") < text.index("machine: ")
    assert "[1/2]" in text  # a cell is text, not markup
    assert json.loads((tmp_path / "r.json").read_text())["rows"][1]["hit"] == "[1/2]"
    assert (tmp_path / "r.md").read_text() == _result().markdown()


def test_label_columns_are_left_and_the_best_cell_is_bold() -> None:
    table = Table.of("t", ["figure", "a", "b"], [["req/s", "1.0", "2.0"]], labels=1, best=frozenset({(0, 2)}))
    rendered = rich_table(table)
    assert [c.justify for c in rendered.columns] == ["left", "right", "right"]
    assert list(rendered.columns[2].cells) == ["[bold green]2.0[/]"]


def test_a_console_writing_to_a_log_is_wide() -> None:
    from gateway_lab.bench.results import console

    assert console(160).width == 160  # pytest captures stdout: not a terminal


def test_a_valid_run_exits_zero_and_says_nothing_more() -> None:
    out = io.StringIO()
    assert write(_result(), Console(file=out, width=120)) == 0
    assert "INVALID" not in out.getvalue() and _result().to_json()["invalid"] == []


def test_failed_requests_make_the_run_invalid_everywhere_it_is_written(tmp_path: Path) -> None:
    result = _result()
    result.count_failed("grpc ours cache_aware", 0, 8)  # none failed: still valid
    assert result.exit_status == 0
    result.count_failed("http ours cache_aware", 2, 8)
    result.require(True, "never said")
    result.require(False, "the worker stalled")
    out = io.StringIO()
    status = write(result, Console(file=out, width=120), json_path=tmp_path / "r.json", markdown_path=tmp_path / "r.md")
    assert status == result.exit_status == 1
    reasons = ["http ours cache_aware: 2 of 8 requests failed", "the worker stalled"]
    assert result.invalid == reasons
    text = out.getvalue()
    assert all(f"INVALID run: {r}" in text for r in reasons) and text.index("INVALID") < text.index("machine: ")
    assert json.loads((tmp_path / "r.json").read_text())["invalid"] == reasons
    assert (tmp_path / "r.md").read_text().splitlines()[-2:] == [f"INVALID run: {r}" for r in reasons]
