"""`token-gateway bench http-guard` (gateway_lab.bench.scenarios.http_guard): the same
request through plain httptools and the guard on an in-memory transport."""

from __future__ import annotations

import argparse

import pytest
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from gateway.server.http.guard import guarded_protocol
from gateway.server.http.limits import HttpLimitsConfig
from gateway_lab.bench.scenarios import http_guard as scenario


async def test_both_protocols_serve_the_request() -> None:
    assert await scenario.run(HttpToolsProtocol, 20) > 0
    assert await scenario.run(guarded_protocol(HttpLimitsConfig()), 20) > 0


async def test_a_tiny_measurement(capsys: pytest.CaptureFixture[str]) -> None:
    parser = argparse.ArgumentParser()
    scenario.add_arguments(parser)
    await scenario.measure(parser.parse_args(["--requests", "20", "--rounds", "1"]))
    line = capsys.readouterr().out.strip()
    assert line.startswith("httptools: ") and "guarded: " in line and "ratio " in line
