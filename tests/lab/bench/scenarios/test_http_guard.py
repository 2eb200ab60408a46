"""`token-gateway bench http-guard` (gateway_lab.bench.scenarios.http_guard): the same
request through plain httptools and the guard on an in-memory transport."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from gateway.server.http.guard import guarded_protocol
from gateway.server.http.limits import HttpLimitsConfig
from gateway_lab.bench.scenarios import http_guard as scenario


async def test_both_protocols_serve_the_request() -> None:
    assert await scenario.run(HttpToolsProtocol, 20) > 0
    assert await scenario.run(guarded_protocol(HttpLimitsConfig()), 20) > 0


def test_a_tiny_measurement(tmp_path: Path) -> None:
    parser = argparse.ArgumentParser()
    scenario.add_arguments(parser)
    out = tmp_path / "g.json"
    assert scenario.main(parser.parse_args(["--requests", "20", "--rounds", "1", "--json", str(out)])) == 0
    written = json.loads(out.read_text())
    assert [r["protocol"] for r in written["rows"]] == ["httptools", "guarded"]
    assert written["httptools_us"] > 0 and written["ratio"] == written["guarded_us"] / written["httptools_us"]
