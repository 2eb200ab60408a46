"""Worker: the load view a policy reads is the last poll with its age."""

from __future__ import annotations

import time

import pytest

from gateway.policies.base import LoadSnapshot
from gateway.workers import worker as worker_module
from gateway.workers.worker import Worker, WorkerInfo
from tests.fake_transport import FakeTransport


def _worker() -> Worker:
    return Worker("grpc://127.0.0.1:5000", FakeTransport("grpc://127.0.0.1:5000"), WorkerInfo(model="m"))  # type: ignore[arg-type]


def test_no_poll_no_view() -> None:
    assert _worker().loads_view() is None


def test_the_view_is_the_last_poll_with_its_age(monkeypatch: pytest.MonkeyPatch) -> None:
    w = _worker()
    clock = [100.0]
    monkeypatch.setattr(worker_module.time, "monotonic", lambda: clock[0])
    w.polled, w.polled_at = LoadSnapshot(num_running_reqs=3), 98.0
    view = w.loads_view()
    assert view is not None and view.num_running_reqs == 3 and view.age_s == pytest.approx(2.0)
    assert w.loads_view() is view  # read again within the reuse window: the same copy
    clock[0] += 1.0
    later = w.loads_view()
    assert later is not None and later.age_s == pytest.approx(3.0)  # past it: the age moves on
    w.polled, w.polled_at = LoadSnapshot(num_running_reqs=7), clock[0]
    fresh = w.loads_view()  # a new poll is seen at once, whatever the window
    assert fresh is not None and fresh.num_running_reqs == 7 and fresh.age_s == 0.0
    assert worker_module.LOADS_VIEW_REUSE_S <= 0.05


def test_real_clock_view_age_is_not_negative() -> None:
    w = _worker()
    w.polled, w.polled_at = LoadSnapshot(), time.monotonic() + 5  # a clock that moved back
    view = w.loads_view()
    assert view is not None and view.age_s == 0.0
