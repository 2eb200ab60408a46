"""The parking rule of ``serve --processes N`` (server/parking.py): how many processes take
connections, from samples of the host's and the set's CPU."""

from __future__ import annotations

from gateway.server.parking import WINDOW, CoreSample, Parking


def feed(parking: Parking, host: float, own: float, n: int = WINDOW) -> list[int]:
    """``n`` one-second samples: ``host`` cores busy in all, ``own`` of them the set's."""
    return [parking.update(CoreSample(1.0, host, own)) for _ in range(n)]


def test_no_spare_core_and_other_work_parks_one_process_per_window() -> None:
    p = Parking(3, 2)
    assert feed(p, host=1.95, own=1.0) == [3, 3, 2]  # decided on a full window, not a single sample
    assert feed(p, host=1.95, own=1.0) == [2, 2, 1]  # one at a time, each on a window in the new state
    assert feed(p, host=2.0, own=0.9) == [1, 1, 1]  # never below one


def test_a_set_that_fills_the_cores_by_itself_is_not_parked() -> None:
    p = Parking(2, 2)
    assert feed(p, host=1.98, own=1.7, n=10)[-1] == 2  # other work takes under half a core: the set is using its cores


def test_a_host_with_a_spare_core_keeps_every_process() -> None:
    p = Parking(2, 2)
    assert feed(p, host=1.5, own=0.6, n=10)[-1] == 2


def test_a_parked_set_takes_a_process_back_when_a_core_is_spare_and_the_active_ones_are_busy() -> None:
    p = Parking(2, 2)
    feed(p, host=1.95, own=0.9)
    assert p.active == 1
    assert feed(p, host=1.2, own=0.5, n=6)[-1] == 1  # a core is spare, but one process is not busy: it suffices
    assert feed(p, host=1.95, own=0.95, n=6)[-1] == 1  # busy, but no spare core
    assert feed(p, host=1.1, own=0.9) == [1, 1, 2]  # busy and a spare core: both serve again


def test_samples_of_no_time_are_ignored() -> None:
    p = Parking(2, 2)
    assert [p.update(CoreSample(0.0, 5.0, 0.0)) for _ in range(10)] == [2] * 10
    assert feed(p, host=1.95, own=1.0) == [2, 2, 1]


def test_a_set_may_start_with_fewer_processes_and_takes_the_others_on_spare_cores() -> None:
    p = Parking(3, 4, active=1)
    assert p.active == 1
    assert feed(p, host=2.5, own=0.9) == [1, 1, 2]  # a spare core and a busy process: one more
    assert feed(p, host=2.9, own=1.8) == [2, 2, 3]
    assert Parking(2, 2, active=0).active == 1 and Parking(2, 2, active=5).active == 2  # within 1..count
