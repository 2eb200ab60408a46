"""`token-gateway bench parsers` (gateway_lab.bench.scenarios.parsers): every format's
template really is a call its parser reads, and a tiny run prints one row per format."""

from __future__ import annotations

import argparse
import json

import pytest

from gateway.parsers.registry import get_tool_parser
from gateway_lab.bench.scenarios import parsers as scenario


@pytest.mark.parametrize("name", sorted(scenario.FORMATS))
def test_each_template_is_one_call_of_its_format(name: str) -> None:
    text = scenario.FORMATS[name].format(x="lorem ipsum")
    content, calls = get_tool_parser(name, tools=scenario.TOOLS).parse(text)
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [("write", {"text": "lorem ipsum"})], content
    assert scenario.cpu_per_delta(name, text, 4) >= 0


def test_a_tiny_run(capsys: pytest.CaptureFixture[str]) -> None:
    parser = argparse.ArgumentParser()
    scenario.add_arguments(parser)
    assert scenario.main(parser.parse_args(["--chars", "200", "--step", "50"])) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| ") and "---" not in line][1:]
    assert [row.split(" | ")[0][2:] for row in rows] == list(scenario.FORMATS)
