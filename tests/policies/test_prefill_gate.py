"""The prefill gate's rule: who waits for whose prefill (pure, no asyncio)."""

from __future__ import annotations

from gateway.policies.prefill_gate import PrefillGate, shared_tokens, slot_free
from gateway.policies.radix_tree import pack

SYSTEM = list(range(1000, 1000 + 1024))


def prompt(tail: int, system: list[int] = SYSTEM) -> bytes:
    return pack([*system, *range(50_000 + tail * 100, 50_000 + tail * 100 + 64)])


def test_shared_tokens_counts_whole_pages_up_to_the_limit() -> None:
    a, b = prompt(1), prompt(2)
    assert shared_tokens(a, b, 10_000) == 1024
    assert shared_tokens(a, b, 10_000, page=16) == 1024
    assert shared_tokens(a, b, 10_000, page=100) == 1000  # 10 whole pages of 100
    assert shared_tokens(a, b, 300) == 300
    assert shared_tokens(a, a, 10_000) == len(a) >> 2
    assert shared_tokens(a, pack([7, 8, 9] * 40), 10_000) == 0
    assert shared_tokens(a, b, 0) == 0


def test_a_request_waits_for_one_in_prefill_on_the_same_worker_sharing_its_prefix() -> None:
    gate = PrefillGate()
    gate.add(1, "w1", prompt(1), cached=0)
    found = gate.blocker("w1", prompt(2), predicted=1024, min_gain_tokens=512)
    assert found is not None and found[0].key == 1 and found[1] == 1024
    assert gate.blocker("w2", prompt(2), predicted=1024, min_gain_tokens=512) is None  # other worker
    gate.remove(1)
    assert gate.blocker("w1", prompt(2), predicted=1024, min_gain_tokens=512) is None and len(gate) == 0


def test_no_wait_when_the_prefix_was_cached_before_the_blocker_or_the_gain_is_small() -> None:
    gate = PrefillGate()
    gate.add(1, "w1", prompt(1), cached=1024)  # it found the system prompt cached: computes only its tail
    assert gate.blocker("w1", prompt(2), predicted=1024, min_gain_tokens=512) is None
    gate.add(2, "w1", prompt(3), cached=700)
    assert gate.blocker("w1", prompt(2), predicted=1024, min_gain_tokens=512) is None  # gains 324
    assert gate.blocker("w1", prompt(2), predicted=1024, min_gain_tokens=256) is not None
    # the predicted match bounds the gain: the tree says the worker holds only 400 tokens of it
    gate.add(3, "w1", prompt(4), cached=0)
    assert gate.blocker("w1", prompt(2), predicted=400, min_gain_tokens=512) is None


def test_unrelated_prompts_and_short_prompts_never_wait() -> None:
    gate = PrefillGate()
    gate.add(1, "w1", prompt(1), cached=0)
    other = prompt(1, system=list(range(9000, 9000 + 1024)))
    assert gate.blocker("w1", other, predicted=1024, min_gain_tokens=512) is None
    gate.add(2, "w1", pack([1, 2, 3]), cached=0)  # too short to be tracked
    assert len(gate) == 1
    assert gate.blocker("w1", pack([1, 2, 3]), predicted=3, min_gain_tokens=1) is None


def test_the_blocker_with_the_largest_gain_is_chosen() -> None:
    gate = PrefillGate()
    long_system = [*SYSTEM, *range(70_000, 70_512)]
    gate.add(1, "w1", prompt(1), cached=0)  # shares 1024 tokens with the new prompt
    gate.add(2, "w1", prompt(2, system=long_system), cached=0)  # shares 1536
    found = gate.blocker("w1", prompt(3, system=long_system), predicted=1536, min_gain_tokens=512)
    assert found is not None and found[0].key == 2 and found[1] == 1536
    gate.add(2, "w1", prompt(2, system=long_system), cached=0)  # re-adding a key replaces it
    assert len(gate) == 2


def test_a_hold_needs_a_free_running_slot_when_the_worker_reports_its_cap() -> None:
    assert slot_free(0, 16) and slot_free(15, 16)
    assert not slot_free(16, 16) and not slot_free(40, 16)
    assert slot_free(500, 0)  # cap unknown: no limit
