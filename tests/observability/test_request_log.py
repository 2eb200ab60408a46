"""The access log line: written with its fields at INFO, not even built when access lines are off."""

from __future__ import annotations

import logging

import pytest

from gateway.observability.request_log import ACCESS_LOGGER, RequestRecord, log_access


def _record() -> RequestRecord:
    record = RequestRecord(method="POST", path="/v1/completions")
    record.request_id, record.status, record.endpoint, record.model = "abc", 200, "/v1/completions", "m"
    return record


def test_an_access_line_carries_the_requests_fields(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger=ACCESS_LOGGER):
        log_access(_record(), 0.0123)
    (line,) = [r for r in caplog.records if r.name == ACCESS_LOGGER]
    assert line.getMessage() == "POST /v1/completions 200 12.3ms"
    fields = line.access  # type: ignore[attr-defined]
    assert fields["request_id"] == "abc" and fields["model"] == "m" and fields["latency_ms"] == 12.3


def test_no_fields_are_built_when_access_lines_are_off(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    record = _record()

    def refuse(latency_s: float) -> dict[str, object]:
        raise AssertionError("access fields built for a line nobody writes")

    monkeypatch.setattr(record, "access_fields", refuse)
    with caplog.at_level(logging.WARNING, logger=ACCESS_LOGGER):
        log_access(record, 0.01)
    assert not [r for r in caplog.records if r.name == ACCESS_LOGGER]
