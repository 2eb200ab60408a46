"""The admission queue's order: priority and aging within a tenant, weighted shares between tenants."""

from __future__ import annotations

from collections import Counter

import pytest

from gateway.policies.fair_queue import FairQueue, parse_weights


def drain(q: FairQueue, now: float = 0.0, count: int | None = None) -> list[object]:
    out = []
    while len(q) and (count is None or len(out) < count):
        entry = q.peek(now)
        assert entry is not None
        q.pop(entry)
        out.append(entry.handle)
    return out


def test_one_tenant_is_first_in_first_out_at_equal_priority() -> None:
    q = FairQueue()
    for i in range(5):
        q.push("a", 0, 1, now=float(i), handle=i)
    assert drain(q, now=10.0) == [0, 1, 2, 3, 4]
    assert len(q) == 0 and q.peek(10.0) is None


def test_higher_priority_first_and_the_sense_can_be_flipped() -> None:
    q = FairQueue()
    q.push("a", 0, 1, 0.0, "normal")
    q.push("a", 5, 1, 1.0, "high")
    q.push("a", -3, 1, 2.0, "low")
    assert drain(q, 3.0) == ["high", "normal", "low"]
    q = FairQueue(low_values_first=True)  # vLLM's sense
    q.push("a", 0, 1, 0.0, "normal")
    q.push("a", 5, 1, 1.0, "late")
    q.push("a", -3, 1, 2.0, "soon")
    assert drain(q, 3.0) == ["soon", "normal", "late"]


def test_aging_lets_an_old_low_priority_request_pass_newer_high_ones() -> None:
    q = FairQueue(aging_s=1.0)
    q.push("a", 0, 1, 0.0, "old low")
    q.push("a", 2, 1, 1.5, "younger high")  # 2 levels up, 1.5 s younger: 0.5 levels ahead
    q.push("a", 2, 1, 2.5, "youngest high")  # 2.5 s younger: 0.5 levels behind
    assert drain(q, 3.0) == ["younger high", "old low", "youngest high"]
    q = FairQueue(aging_s=0.0)  # no aging: priority alone
    q.push("a", 0, 1, 0.0, "old low")
    q.push("a", 2, 1, 100.0, "new high")
    assert drain(q, 200.0) == ["new high", "old low"]


def test_backlogged_tenants_share_by_weight() -> None:
    q = FairQueue({"heavy": 1.0, "gold": 3.0})
    for _ in range(400):
        q.push("heavy", 0, 1, 0.0, "heavy")
    for _ in range(100):
        q.push("gold", 0, 1, 0.0, "gold")
    served = Counter(drain(q, 0.0, count=100))
    assert served == {"gold": 75, "heavy": 25}


def test_a_light_tenant_does_not_wait_behind_a_heavy_backlog() -> None:
    q = FairQueue()
    for i in range(50):
        q.push("heavy", 0, 1, float(i), "heavy")
    drain(q, 50.0, count=10)  # heavy has been served a while alone
    q.push("light", 0, 1, 60.0, "light")
    assert drain(q, 60.0, count=1) == ["light"]


def test_an_idle_spell_banks_no_credit() -> None:
    q = FairQueue()
    for _ in range(20):
        q.push("a", 0, 1, 0.0, "a")
    drain(q, 0.0, count=20)  # a alone, 20 services
    for _ in range(20):
        q.push("a", 0, 1, 1.0, "a")
        q.push("b", 0, 1, 1.0, "b")
    # b arrived after a long idle spell: it starts at the current virtual time, not at 0,
    # so it does not get 20 services in a row before a is served again.
    first = drain(q, 1.0, count=6)
    assert Counter(first) == {"a": 3, "b": 3}


def test_slots_are_charged_so_a_batch_counts_as_its_prompts() -> None:
    q = FairQueue()
    for _ in range(10):
        q.push("batch", 0, 4, 0.0, "batch")
        q.push("single", 0, 1, 0.0, "single")
    served = Counter(drain(q, 0.0, count=10))
    assert served["single"] == 8 and served["batch"] == 2


def test_priority_stays_inside_a_tenant_unless_across_tenants() -> None:
    def run(across: bool) -> list[object]:
        q = FairQueue(across_tenants=across)
        for _ in range(3):
            q.push("a", 0, 1, 0.0, "a")
        for _ in range(3):
            q.push("b", 9, 1, 0.0, "b")
        return drain(q, 0.0)

    assert run(False) == ["a", "b", "a", "b", "a", "b"]  # fair shares: b's priority buys it nothing over a
    assert run(True) == ["b", "b", "b", "a", "a", "a"]


def test_removed_entries_leave_at_once() -> None:
    q = FairQueue()
    entries = [q.push("a", 0, 1, 0.0, i) for i in range(3)]
    q.remove(entries[0])
    q.remove(entries[0])  # idempotent
    assert len(q) == 2 and sorted(e.handle for e in q.entries()) == [1, 2]
    assert drain(q) == [1, 2]
    other = q.push("b", 0, 1, 0.0, "b")
    q.remove(other)
    assert len(q) == 0 and q.peek(0.0) is None and q.drain() == []


def test_parse_weights() -> None:
    assert parse_weights(["gold=3", "a=b=0.5"]) == {"gold": 3.0, "a=b": 0.5}
    for bad in ["gold", "=2", "gold=0", "gold=-1", "gold=x", "gold=inf", "gold=nan"]:
        with pytest.raises(ValueError, match="--key-weights"):
            parse_weights([bad])
