"""`token-gateway bench parsers` (gateway_lab.bench.scenarios.parsers): every format's
template really is a call its parser reads, and a tiny run writes one row per format."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from gateway.parsers.registry import get_tool_parser
from gateway_lab.bench.scenarios import parsers as scenario


@pytest.mark.parametrize("name", sorted(scenario.FORMATS))
def test_each_template_is_one_call_of_its_format(name: str) -> None:
    text = scenario.FORMATS[name].format(x="lorem ipsum")
    content, calls = get_tool_parser(name, tools=scenario.TOOLS).parse(text)
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [("write", {"text": "lorem ipsum"})], content
    assert scenario.cpu_per_delta(name, text, 4) >= 0


def test_a_tiny_run(tmp_path: Path) -> None:
    parser = argparse.ArgumentParser()
    scenario.add_arguments(parser)
    md, out = tmp_path / "p.md", tmp_path / "p.json"
    assert scenario.main(parser.parse_args(["--chars", "200", "--step", "50", "--markdown", str(md), "--json", str(out)])) == 0
    rows = [line for line in md.read_text().splitlines() if line.startswith("| ") and "---" not in line][1:]
    assert [row.split(" | ")[0][2:] for row in rows] == list(scenario.FORMATS)
    written = json.loads(out.read_text())
    assert [f["format"] for f in written["formats"]] == list(scenario.FORMATS) and "machine" in written
