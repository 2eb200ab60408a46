"""The one module of header names."""

from __future__ import annotations

import pytest

from gateway.protocol import headers
from gateway.protocol.errors import InvalidRequestError
from gateway.protocol.headers import priority_header


def test_smg_names_come_first_so_smg_clients_work_unchanged() -> None:
    assert headers.ROUTING_KEY_HEADERS == ("x-smg-routing-key", "x-routing-key")
    assert headers.TARGET_WORKER_HEADERS == ("x-smg-target-worker", "x-target-worker")


def test_first_header_takes_the_first_non_empty_name() -> None:
    names = headers.TARGET_WORKER_HEADERS
    assert headers.first_header({"x-target-worker": "b", "x-smg-target-worker": "a"}, names) == "a"
    assert headers.first_header({"x-smg-target-worker": "", "x-target-worker": "b"}, names) == "b"
    assert headers.first_header({}, names) is None


def test_bearer() -> None:
    assert headers.bearer("k") == ("authorization", "Bearer k")


def test_priority_header() -> None:
    assert priority_header({}) is None and priority_header({"x-priority": ""}) is None
    assert priority_header({"x-priority": " -3 "}) == -3
    for bad in ["high", "1.5", str(2**31)]:
        with pytest.raises(InvalidRequestError):
            priority_header({"x-priority": bad})
