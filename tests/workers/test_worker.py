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


def _fresh_view(w: Worker) -> object:
    """The view built from nothing (what ``view`` returned before it reused views)."""
    w._view = None
    return w.view()


def test_a_view_is_reused_only_while_every_figure_is_the_same() -> None:
    w = _worker()
    first = w.view()
    assert w.view() is first  # nothing changed: the same object
    changes = [
        lambda: w.load.acquire(100, 8),
        lambda: setattr(w.remote_load, "in_flight", 2),
        lambda: setattr(w.remote_load, "queued_prefill_tokens", 40),
        lambda: setattr(w.remote_load, "running_decode_tokens", 9),
        lambda: setattr(w, "healthy", False),
        lambda: setattr(w, "healthy", True),
        lambda: setattr(w, "polled", LoadSnapshot(num_running_reqs=5)),
        lambda: setattr(w, "info", WorkerInfo(model="m", page_size=16, kv_capacity_tokens=4096, max_running_requests=3)),
        lambda: setattr(w, "bootstrap_port", 8998),
        lambda: w.trip("stalled"),
        lambda: (w.breaker.record_success(), setattr(w, "breaker", type(w.breaker)())),
        lambda: setattr(w, "draining", True),
    ]
    before = w.view()
    for change in changes:
        change()
        now = w.view()
        assert now == _fresh_view(w)  # always what a fresh build says
        assert now != before
        before = w.view()
        assert w.view() is before
