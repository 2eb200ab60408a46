"""The per-worker load counter and its guard."""

from __future__ import annotations

from gateway.workers.load import WorkerLoad


def test_guard_moves_weight_from_prefill_to_decode_to_gone() -> None:
    load = WorkerLoad()
    guard = load.acquire(100, 20)
    assert (load.in_flight, load.queued_prefill_tokens, load.running_decode_tokens, load.total_requests) == (1, 100, 0, 1)
    guard.first_token()
    guard.first_token()  # once only
    assert (load.queued_prefill_tokens, load.running_decode_tokens) == (0, 20)
    guard.release()
    guard.release()
    assert (load.in_flight, load.queued_prefill_tokens, load.running_decode_tokens) == (0, 0, 0)
    assert load.total_requests == 1


def test_release_before_the_first_token_gives_back_the_prefill_weight() -> None:
    load = WorkerLoad()
    with load.acquire(50, 10):
        assert load.queued_prefill_tokens == 50
    assert (load.in_flight, load.queued_prefill_tokens, load.running_decode_tokens) == (0, 0, 0)


def test_first_token_after_release_changes_nothing() -> None:
    load = WorkerLoad()
    guard = load.acquire(5, 5)
    guard.release()
    guard.first_token()
    assert (load.queued_prefill_tokens, load.running_decode_tokens) == (0, 0)


def test_many_guards_sum() -> None:
    load = WorkerLoad()
    guards = [load.acquire(10, 2) for _ in range(5)]
    for g in guards[:2]:
        g.first_token()
    assert (load.in_flight, load.queued_prefill_tokens, load.running_decode_tokens) == (5, 30, 4)
    for g in guards:
        g.release()
    assert (load.in_flight, load.queued_prefill_tokens, load.running_decode_tokens) == (0, 0, 0)


def test_a_silent_call_is_counted_apart_until_released_once() -> None:
    load = WorkerLoad()
    guard = load.acquire(10, 4, silent=True)
    other = load.acquire(10, 4)
    assert (load.in_flight, load.silent) == (2, 1)
    guard.release()
    guard.release()
    assert (load.in_flight, load.silent) == (1, 0)
    other.release()
    assert (load.in_flight, load.silent) == (0, 0)
