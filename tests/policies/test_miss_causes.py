"""MissCauses: each missed prompt token charged to why the worker did not have it."""

from __future__ import annotations

import pytest

from gateway.policies.miss_causes import CAUSES, MissCauses, MissTicket

from .helpers import tokens


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def serve(ledger: MissCauses, worker: str, toks: list[int], cached: int, reason: str = "cache_hit") -> MissTicket:
    ticket = MissTicket(worker, toks, reason)
    ledger.dispatched(ticket)
    ledger.finished(ticket, cached, True)
    return ticket


def tokens_by_cause(ledger: MissCauses) -> dict[str, int]:
    return {c: n.tokens for c, n in ledger.counts.items() if n.tokens}


def test_first_sight_then_evicted_then_held_elsewhere() -> None:
    ledger = MissCauses(16)
    prompt = tokens(64, 1)
    serve(ledger, "w0", prompt, 0)
    assert tokens_by_cause(ledger) == {"first_sight": 63}  # the last token is always computed
    serve(ledger, "w0", prompt, 32)  # w0 served it and lost half of it
    assert tokens_by_cause(ledger) == {"first_sight": 63, "evicted": 31}
    serve(ledger, "w1", prompt + tokens(16, 2), 0, reason="round_robin")  # w0 has it; sent to w1
    counts = tokens_by_cause(ledger)
    assert counts["held_elsewhere"] == 64 and counts["first_sight"] == 63 + 15
    assert ledger.counts["held_elsewhere"].requests == 1 and ledger.missed_requests == 3


def test_spilled_for_load_and_a_full_hit_costs_nothing() -> None:
    ledger = MissCauses(16)
    prompt = tokens(48, 3)
    serve(ledger, "w0", prompt, 0)
    serve(ledger, "w0", prompt, 47)  # all but the last token: a hit, nothing charged
    serve(ledger, "w1", prompt, 0, reason="load_balanced")
    assert tokens_by_cause(ledger) == {"first_sight": 47, "spilled_for_load": 47}
    assert ledger.requests == 3 and ledger.missed_requests == 2


def test_a_duplicate_sent_while_the_first_is_in_flight_is_in_prefill() -> None:
    ledger = MissCauses(16)
    prompt = tokens(64, 4)
    first, second = MissTicket("w0", prompt, "no_match"), MissTicket("w0", prompt, "cache_hit")
    ledger.dispatched(first)
    ledger.dispatched(second)
    ledger.finished(first, 0, True)
    ledger.finished(second, 0, True)
    assert tokens_by_cause(ledger) == {"first_sight": 63, "in_prefill": 63}
    # a stream that ended before output (abandoned) unmarks its blocks and charges nothing
    third = MissTicket("w0", tokens(64, 5), "no_match")
    ledger.dispatched(third)
    ledger.abandoned(third)
    ledger.finished(third, 0, True)  # once only
    fourth = serve(ledger, "w0", tokens(64, 5), 0)
    assert fourth.runs == [(4, "first_sight")] and ledger.counts["in_prefill"].tokens == 63


def test_a_new_worker_is_new_for_a_while_and_a_removed_one_forgets() -> None:
    clock = Clock()
    ledger = MissCauses(16, new_worker_s=30, clock=clock)
    prompt = tokens(64, 6)
    serve(ledger, "w0", prompt, 0)
    ledger.joined("w9")
    serve(ledger, "w9", prompt, 0, reason="load_balanced")
    assert ledger.counts["new_worker"].tokens == 63
    clock.now = 31
    serve(ledger, "w8", prompt, 0, reason="load_balanced")
    assert ledger.counts["spilled_for_load"].tokens == 63
    ledger.forget_worker("w0")
    serve(ledger, "w0", prompt, 0, reason="ring_owner")  # held by w9 and w8, and w0's past is gone
    assert ledger.counts["evicted"].tokens == 0 and ledger.counts["held_elsewhere"].tokens == 63


def test_sets_are_bounded_and_snapshot_lists_every_cause() -> None:
    ledger = MissCauses(16, worker_blocks=4, pool_blocks=8)
    for i in range(10):
        serve(ledger, "w0", tokens(64, 100 + i), 0)
    assert len(ledger._held["w0"]) == 4 and len(ledger._seen) == 8
    snap = ledger.snapshot()
    assert set(CAUSES) <= set(snap) and snap["_requests"] == 10
    with pytest.raises(ValueError):
        MissCauses(0)
