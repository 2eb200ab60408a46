"""Admission's fair queue: priority, key weights, the fleet's slots as the cap, leaving waiters.

(The cap, timeouts, rate limits and the HTTP side: ``tests/e2e/http/test_admission.py``.)
"""

from __future__ import annotations

import asyncio
from collections import Counter

import pytest

from gateway.protocol.errors import QueueTimeoutError
from gateway.server.admission import Admission, AdmissionConfig


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def run_in_order(adm: Admission, waiters: list[tuple[str, int, str]], served: list[str]) -> None:
    """Queue ``(key, priority, label)`` waiters behind one held slot, release it, and
    record the order they are admitted in (each holds its slot for one loop turn)."""
    holder = await adm.acquire("holder")

    async def one(key: str, priority: int, label: str) -> None:
        async with adm.admit(key, 1, priority):
            served.append(label)
            await asyncio.sleep(0)

    tasks = []
    for key, priority, label in waiters:
        tasks.append(asyncio.ensure_future(one(key, priority, label)))
        await settle()
    holder.release()
    await asyncio.wait_for(asyncio.gather(*tasks), 5)


async def test_priority_orders_one_keys_waiters() -> None:
    adm = Admission(AdmissionConfig(max_concurrent_requests=1, priority_aging_s=0))
    served: list[str] = []
    await run_in_order(adm, [("k", 0, "normal"), ("k", -1, "low"), ("k", 7, "high"), ("k", 0, "normal 2")], served)
    assert served == ["high", "normal", "normal 2", "low"]
    assert adm.in_flight == 0 and adm.queued == 0


async def test_low_priority_values_first_reads_priority_as_vllm_does() -> None:
    adm = Admission(AdmissionConfig(max_concurrent_requests=1, low_priority_values_first=True))
    served: list[str] = []
    await run_in_order(adm, [("k", 0, "normal"), ("k", 7, "late"), ("k", -1, "soon")], served)
    assert served == ["soon", "normal", "late"]


async def test_keys_share_the_queue_by_weight() -> None:
    adm = Admission(AdmissionConfig(max_concurrent_requests=1, max_queued_requests=1000), weights={"gold": 2.0})
    waiters = [("bulk", 0, "bulk")] * 60 + [("gold", 0, "gold")] * 30
    served: list[str] = []
    await run_in_order(adm, waiters, served)
    # While both are backlogged (the first 45 admissions), gold gets two for bulk's one.
    assert Counter(served[:45]) == {"gold": 30, "bulk": 15}


async def test_a_light_key_goes_ahead_of_a_heavy_keys_backlog() -> None:
    adm = Admission(AdmissionConfig(max_concurrent_requests=1, max_queued_requests=1000))
    served: list[str] = []
    await run_in_order(adm, [("heavy", 0, "heavy")] * 20 + [("light", 0, "light")], served)
    assert served.index("light") <= 1


async def test_a_key_named_in_key_weights_by_config() -> None:
    adm = Admission(AdmissionConfig(max_concurrent_requests=1, key_weights=["gold=3"]))
    assert adm._waiters.weights == {"gold": 3.0}
    with pytest.raises(ValueError, match="--key-weights"):
        AdmissionConfig(key_weights=["gold"])


async def test_fleet_headroom_caps_admission_at_the_fleets_running_slots() -> None:
    fleet = {"slots": 4, "workers": 2}
    adm = Admission(AdmissionConfig(fleet_headroom=1), fleet_slots=lambda: (fleet["slots"], fleet["workers"]))
    assert adm.cap() == 6  # 4 slots + 1 per worker
    tickets = [await adm.acquire("k") for _ in range(6)]
    waiter = asyncio.ensure_future(adm.acquire("k"))
    await settle()
    assert not waiter.done() and adm.queued == 1
    fleet["slots"] = 0  # a worker reports no max_running_requests: no fleet cap
    assert adm.cap() == 0
    fleet["slots"] = 4
    tickets.pop().release()
    tickets.append(await asyncio.wait_for(waiter, 1))
    for t in tickets:
        t.release()
    assert adm.in_flight == 0
    off = Admission(AdmissionConfig(fleet_headroom=-1), fleet_slots=lambda: (4, 2))
    assert off.cap() == 0
    both = Admission(AdmissionConfig(max_concurrent_requests=3, fleet_headroom=0), fleet_slots=lambda: (4, 2))
    assert both.cap() == 3


async def test_contended_while_every_slot_is_taken_someone_waits_or_two_keys_hold_slots() -> None:
    adm = Admission(AdmissionConfig(fleet_headroom=0), fleet_slots=lambda: (2, 1))
    assert not adm.contended()
    tickets = [await adm.acquire("k")]
    assert not adm.contended()  # one key with room: nobody needs to go first
    tickets.append(await adm.acquire("k"))
    assert adm.contended()  # the cap is reached: the worker gate paces prefill now
    waiter = asyncio.ensure_future(adm.acquire("k"))
    await settle()
    tickets.pop().release()  # handed to the waiter: still full
    tickets.append(await asyncio.wait_for(waiter, 1))
    assert adm.contended()
    for t in tickets:
        t.release()
    assert not adm.contended()
    free = Admission(AdmissionConfig(), fleet_slots=lambda: (2, 1))
    one = await free.acquire("a")
    assert not free.contended()  # no cap, one key
    other = await free.acquire("b")
    assert free.contended()  # two keys share the fleet
    other.release()
    one.release()
    assert not free.contended()


async def test_a_lone_batch_larger_than_the_fleet_cap_still_runs() -> None:
    adm = Admission(AdmissionConfig(fleet_headroom=0), fleet_slots=lambda: (2, 1))
    ticket = await asyncio.wait_for(adm.acquire("k", 5), 1)
    assert adm.in_flight == 5
    ticket.release()


async def test_waiters_by_priority_class_and_key_and_leaving_frees_the_place() -> None:
    adm = Admission(AdmissionConfig(max_concurrent_requests=1, queue_timeout_s=0.2))
    holder = await adm.acquire("k")
    high = asyncio.ensure_future(adm.acquire("a", 1, 3))
    low = asyncio.ensure_future(adm.acquire("b", 1, -2))
    await settle()
    plain = asyncio.ensure_future(adm.acquire(None, 1, 0))
    await settle()
    assert adm.waiting() == {("above", "a"): 1, ("below", "b"): 1, ("default", "-"): 1}
    high.cancel()  # its client left
    await asyncio.gather(high, return_exceptions=True)
    assert adm.queued == 2 and ("above", "a") not in adm.waiting()
    low.cancel()
    await asyncio.gather(low, return_exceptions=True)
    assert adm.waiting() == {("default", "-"): 1}
    holder.release()  # the one left is next, not a departed waiter
    ticket = await asyncio.wait_for(plain, 1)
    assert adm.in_flight == 1 and adm.queued == 0 and not adm.waiting()
    ticket.release()
    holder = await adm.acquire("k")
    with pytest.raises(QueueTimeoutError):
        await adm.acquire("b", 1, 5)
    assert adm.queued == 0 and not adm.waiting()
    holder.release()
    assert adm.in_flight == 0


async def test_fair_reserve_keeps_the_last_slots_for_a_key_below_its_share() -> None:
    adm = Admission(AdmissionConfig(fleet_headroom=0, fair_reserve=1), fleet_slots=lambda: (8, 2))
    alone = [await adm.acquire("heavy") for _ in range(8)]  # a key alone may take every slot
    for t in alone:
        t.release()
    (await adm.acquire("light")).release()  # light was here a moment ago: it shares the cap
    heavy = [await adm.acquire("heavy") for _ in range(6)]  # cap 8, reserve 2: past its share, heavy fills 6
    blocked = asyncio.ensure_future(adm.acquire("heavy"))
    await settle()
    assert not blocked.done() and adm.in_flight == 6
    light = await asyncio.wait_for(adm.acquire("light"), 1)  # below its share (4 of 8): takes a reserved slot at once
    assert adm.in_flight == 7 and not blocked.done()
    light.release()
    heavy.pop().release()  # heavy's own release lets its waiter in, up to cap - reserve again
    heavy.append(await asyncio.wait_for(blocked, 1))
    assert adm.in_flight == 6
    for t in heavy:
        t.release()
    assert adm.in_flight == 0 and not adm._held


async def test_below_share_tells_a_key_under_its_weighted_share_of_the_cap() -> None:
    adm = Admission(AdmissionConfig(max_concurrent_requests=4, fair_reserve=1), weights={"a": 3.0})
    held = [await adm.acquire("a") for _ in range(2)] + [await adm.acquire("b")]
    assert adm.below_share("a") and not adm.below_share("b")  # shares 3 and 1 of 4
    held.append(await adm.acquire("a"))
    assert not adm.below_share("a")
    assert Admission(AdmissionConfig()).below_share("anyone")  # no cap: nobody is past a share
    for ticket in held:
        ticket.release()


async def test_new_limits_apply_at_once_and_a_raised_cap_admits_waiters() -> None:
    """A process of a set takes its new share of the set's limits when the active processes
    change (``Admission.resize``): a waiter gets the slot the raised cap makes."""
    adm = Admission(AdmissionConfig(max_concurrent_requests=1))
    first = await adm.acquire("a")
    waiter = asyncio.ensure_future(adm.acquire("b"))
    await settle()
    assert not waiter.done() and adm.queued == 1
    adm.resize(AdmissionConfig(max_concurrent_requests=2))
    second = await asyncio.wait_for(waiter, 5)
    assert adm.in_flight == 2 and adm.cap() == 2
    adm.resize(AdmissionConfig(max_concurrent_requests=1, max_queued_requests=0))
    with pytest.raises(Exception, match="full"):  # lowered: no room, and no queue
        await adm.acquire("c")
    first.release()
    second.release()
    assert adm.in_flight == 0


async def test_a_key_yields_prefill_to_a_lighter_key_below_its_share_never_when_alone() -> None:
    adm = Admission(AdmissionConfig(max_concurrent_requests=8, fair_prefill_reserve=True))
    held = [await adm.acquire("heavy") for _ in range(3)]
    assert not adm.yields_prefill("heavy")  # alone: keeping a worker free would cost its own cold burst
    held.append(await adm.acquire("light"))
    # light holds 1 of its share of 4, heavy 3: heavy's prompts make room for light's, not the reverse
    assert adm.yields_prefill("heavy") and not adm.yields_prefill("light")
    held += [await adm.acquire("light") for _ in range(3)]  # light at its share: nobody yields to it
    assert not adm.yields_prefill("heavy")
    for ticket in held:
        ticket.release()
    assert not adm.yields_prefill("heavy")  # light asked lately and holds no fewer than heavy
    weighted = Admission(AdmissionConfig(max_concurrent_requests=8, fair_prefill_reserve=True), weights={"a": 3.0})
    held = [await weighted.acquire("a") for _ in range(3)] + [await weighted.acquire("b") for _ in range(2)]
    # a holds more slots but 1 per weight against b's 2, and less than its share of 6
    assert weighted.yields_prefill("b") and not weighted.yields_prefill("a")
    for ticket in held:
        ticket.release()
