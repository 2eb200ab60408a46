"""The worker gate: per worker, requests past its running slots wait in fair order."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from gateway.pipeline.worker_gate import CALLER, Pass, WorkerGate


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def enter_as(gate: WorkerGate, worker: str, slots: int, tenant: str, priority: int = 0) -> Callable[[], None]:
    """``gate.enter`` from a task whose caller is ``tenant`` (admission sets it per task)."""
    CALLER.set((tenant, priority))
    return await gate.enter(worker, slots)


def start(gate: WorkerGate, worker: str, slots: int, tenant: str, priority: int = 0) -> asyncio.Task[Callable[[], None]]:
    return asyncio.create_task(enter_as(gate, worker, slots, tenant, priority))  # a task runs in its own context


async def test_free_slots_pass_at_once_and_the_rest_wait() -> None:
    gate = WorkerGate()
    first = await gate.enter("w1", 2)
    second = await gate.enter("w1", 2)
    third = start(gate, "w1", 2, "k")
    await settle()
    assert not third.done() and gate.held("w1") == 1 and gate.through("w1") == 2
    other = await gate.enter("w2", 2)  # another worker's slots are its own
    first()
    first()  # a release is given back once, however often it is called
    await settle()
    assert third.done() and gate.through("w1") == 2 and gate.held() == 0
    second()
    (await third)()
    other()
    assert gate.through("w1") == 0 and gate.through("w2") == 0


async def test_unknown_slots_never_wait() -> None:
    gate = WorkerGate()
    releases = [await gate.enter("w", 0) for _ in range(50)]
    assert gate.through("w") == 0
    for release in releases:
        release()


async def test_headroom_lets_more_through() -> None:
    gate = WorkerGate(headroom=1)
    held = [await gate.enter("w", 1), await gate.enter("w", 1)]
    waiting = start(gate, "w", 1, "k")
    await settle()
    assert not waiting.done()
    held[0]()
    await settle()
    assert waiting.done()


async def test_a_light_key_takes_the_next_slot_before_a_heavy_backlog() -> None:
    gate = WorkerGate()
    running = await gate.enter("w", 1)
    heavy = [start(gate, "w", 1, "heavy") for _ in range(5)]
    await settle()
    light = start(gate, "w", 1, "light")
    await settle()
    order: list[str] = []
    release = running
    for _ in range(6):
        release()
        await settle()
        done = [t for t in (*heavy, light) if t.done() and not getattr(t, "seen", False)]
        assert len(done) == 1
        t = done[0]
        t.seen = True  # type: ignore[attr-defined]
        order.append("light" if t is light else "heavy")
        release = t.result()
    release()
    # both keys start level and heavy's head came first; light then overtakes heavy's other four
    assert order == ["heavy", "light", "heavy", "heavy", "heavy", "heavy"]


async def serve_one_slot(gate: WorkerGate, keys: list[str]) -> list[str]:
    """Hold ``w``'s one slot, queue a waiter per entry of ``keys`` (in that order), then
    release slot after slot: the keys in the order the gate let them through."""
    running = await gate.enter("w", 1)
    tasks = []
    for key in keys:
        tasks.append((key, start(gate, "w", 1, key)))
        await settle()
    order: list[str] = []
    release = running
    for _ in keys:
        release()
        await settle()
        ready = [(k, t) for k, t in tasks if t.done() and not getattr(t, "seen", False)]
        assert len(ready) == 1
        key, t = ready[0]
        t.seen = True  # type: ignore[attr-defined]
        order.append(key)
        release = t.result()
    release()
    assert gate.through("w") == 0 and gate.held() == 0
    return order


async def test_share_first_lets_a_key_below_its_fleet_share_through_before_the_others() -> None:
    keys = ["heavy", "heavy", "heavy", "light", "light"]
    below = {"light"}
    # One worker's own queue takes turns: light's second request waits behind a heavy one,
    # however little of the fleet light holds.
    turns = await serve_one_slot(WorkerGate(below_share=lambda t: t in below), keys)
    assert turns == ["heavy", "light", "heavy", "light", "heavy"]
    first = await serve_one_slot(WorkerGate(share_first=True, below_share=lambda t: t in below), keys)
    assert first == ["light", "light", "heavy", "heavy", "heavy"]
    # Once no key waiting is below its share, the fair turns are back.
    below.clear()
    level = await serve_one_slot(WorkerGate(share_first=True, below_share=lambda t: t in below), keys)
    assert level == turns


async def test_weights_share_one_workers_slots() -> None:
    gate = WorkerGate({"a": 2.0, "b": 1.0})
    running = await gate.enter("w", 1)
    tasks = {key: [start(gate, "w", 1, key) for _ in range(12)] for key in ("a", "b")}
    await settle()
    served: list[str] = []
    release = running
    for _ in range(12):
        release()
        await settle()
        ready = [(k, t) for k, ts in tasks.items() for t in ts if t.done() and not getattr(t, "seen", False)]
        assert len(ready) == 1
        key, t = ready[0]
        t.seen = True  # type: ignore[attr-defined]
        served.append(key)
        release = t.result()
    assert served.count("a") == 8 and served.count("b") == 4
    release()
    for ts in tasks.values():
        for t in ts:
            if not t.done():
                t.cancel()
    await settle()
    assert gate.held() == 0


async def test_priority_orders_one_keys_waiters() -> None:
    gate = WorkerGate()
    running = await gate.enter("w", 1)
    low = start(gate, "w", 1, "k", 0)
    await settle()
    high = start(gate, "w", 1, "k", 5)
    await settle()
    running()
    await settle()
    assert high.done() and not low.done()
    high.result()()
    await settle()
    assert low.done()
    low.result()()


async def test_a_cancelled_waiter_leaves_and_frees_nothing() -> None:
    gate = WorkerGate()
    running = await gate.enter("w", 1)
    gone = start(gate, "w", 1, "k")
    stays = start(gate, "w", 1, "k")
    await settle()
    gone.cancel()
    await settle()
    assert gate.held("w") == 1 and gate.through("w") == 1
    running()
    await settle()
    assert stays.done() and gate.through("w") == 1
    stays.result()()
    assert gate.through("w") == 0


async def test_a_slot_granted_to_a_waiter_that_left_goes_to_the_next() -> None:
    gate = WorkerGate()
    running = await gate.enter("w", 1)
    first = start(gate, "w", 1, "k")
    second = start(gate, "w", 1, "k")
    await settle()
    running()  # the slot is handed to ``first`` ...
    first.cancel()  # ... which is cancelled before it resumes
    await settle()
    assert first.cancelled() and second.done() and gate.through("w") == 1
    second.result()()
    assert gate.through("w") == 0 and gate.held() == 0


async def test_a_reserved_slot_goes_only_to_a_key_below_its_share() -> None:
    below = {"light"}
    gate = WorkerGate(reserve=1, below_share=lambda tenant: tenant in below)
    running = await gate.enter("w", 2)  # 2 slots, 1 reserved: one for anyone
    heavy = start(gate, "w", 2, "heavy")
    await settle()
    assert not heavy.done() and gate.through("w") == 1  # heavy is at its share: the reserved slot waits
    light = start(gate, "w", 2, "light")
    await settle()
    assert light.done() and not heavy.done()  # light takes it at once, past heavy's waiter
    light.result()()
    await settle()
    assert not heavy.done()
    running()
    await settle()
    assert heavy.done()
    heavy.result()()
    assert gate.through("w") == 0 and gate.held() == 0


async def test_the_reserve_keeps_running_slots_free_past_the_headroom() -> None:
    gate = WorkerGate(headroom=1, reserve=1, below_share=lambda tenant: tenant == "light")
    heavy = [start(gate, "w", 2, "heavy") for _ in range(3)]
    await settle()
    assert sum(t.done() for t in heavy) == 1  # 2 running slots, 1 reserved: the headroom is not heavy's either
    light = [start(gate, "w", 2, "light") for _ in range(3)]
    await settle()
    assert sum(t.done() for t in light) == 2 and gate.through("w") == 3  # running slots plus the headroom
    for t in (*heavy, *light):
        if t.done():
            t.result()()
        else:
            t.cancel()
    await settle()
    assert gate.through("w") == 0 and gate.held() == 0


async def enter_paced(gate: WorkerGate, worker: str, tokens: int, tenant: str = "k", slots: int = 8) -> Pass:
    CALLER.set((tenant, 0))
    return await gate.enter(worker, slots, tokens)


def start_paced(gate: WorkerGate, worker: str, tokens: int, tenant: str = "k") -> asyncio.Task[Pass]:
    return asyncio.create_task(enter_paced(gate, worker, tokens, tenant))


async def test_the_prefill_budget_holds_a_request_with_a_free_slot_until_a_first_token() -> None:
    gate = WorkerGate(prefill_budget=1000)
    first = await enter_paced(gate, "w", 600)
    second = await enter_paced(gate, "w", 400)  # 1,000 pending: exactly the budget
    third = start_paced(gate, "w", 100)
    await settle()
    assert not third.done() and gate.prefill_pending("w") == 1000 and gate.through("w") == 2 and gate.paced == 1
    first.prefilled()  # its first token: its tokens leave the budget, its slot stays taken
    first.prefilled()  # once
    await settle()
    assert third.done() and gate.prefill_pending("w") == 500 and gate.through("w") == 3
    for p in (first, second, third.result()):
        p()
    assert gate.prefill_pending("w") == 0 and gate.through("w") == 0


async def test_a_request_alone_passes_whatever_its_size_and_its_end_frees_its_tokens() -> None:
    gate = WorkerGate(prefill_budget=100)
    big = await enter_paced(gate, "w", 5000)
    assert not big.waited and gate.prefill_pending("w") == 5000
    small = start_paced(gate, "w", 1)
    await settle()
    assert not small.done()
    big()  # it ended before any first token (a worker error): its tokens go with its slot
    big.prefilled()
    await settle()
    assert small.done() and small.result().waited and gate.prefill_pending("w") == 1
    small.result()()
    assert gate.prefill_pending("w") == 0


async def test_without_a_budget_prefill_tokens_hold_nothing() -> None:
    gate = WorkerGate()
    passes = [await enter_paced(gate, "w", 10_000) for _ in range(8)]
    assert gate.prefill_pending("w") == 0 and gate.through("w") == 8 and gate.paced == 0
    for p in passes:
        p()


async def test_the_freed_budget_goes_to_the_light_key_first() -> None:
    gate = WorkerGate(prefill_budget=500)
    pending = await enter_paced(gate, "w", 500, "heavy")
    heavy = [start_paced(gate, "w", 500, "heavy") for _ in range(4)]
    await settle()
    light = start_paced(gate, "w", 500, "light")
    await settle()
    order: list[str] = []
    current = pending
    for _ in range(5):
        current.prefilled()
        await settle()
        done = [t for t in (*heavy, light) if t.done() and not getattr(t, "seen", False)]
        assert len(done) == 1
        done[0].seen = True  # type: ignore[attr-defined]
        order.append("light" if done[0] is light else "heavy")
        current = done[0].result()
    # the keys start level and heavy's head came first; light then overtakes heavy's other three
    assert order == ["heavy", "light", "heavy", "heavy", "heavy"]
    assert gate.through("w") == 6


async def test_a_cold_head_is_not_starved_by_smaller_requests_behind_it() -> None:
    gate = WorkerGate(prefill_budget=1000)
    pending = await enter_paced(gate, "w", 900, "a")
    cold = start_paced(gate, "w", 800, "b")
    await settle()
    warm = start_paced(gate, "w", 50, "c")  # would fit, but waits behind the head of the fair order
    await settle()
    assert not cold.done() and not warm.done()
    pending.prefilled()
    await settle()
    assert cold.done() and warm.done() and gate.prefill_pending("w") == 850
    for p in (pending, cold.result(), warm.result()):
        p()


async def test_a_granted_waiter_that_left_gives_its_tokens_back() -> None:
    gate = WorkerGate(prefill_budget=100)
    pending = await enter_paced(gate, "w", 100)
    first = start_paced(gate, "w", 100)
    second = start_paced(gate, "w", 100)
    await settle()
    pending.prefilled()  # the budget is handed to ``first`` ...
    first.cancel()  # ... which is cancelled before it resumes
    await settle()
    assert first.cancelled() and second.done() and gate.prefill_pending("w") == 100
    pending()
    second.result()()
    assert gate.prefill_pending("w") == 0 and gate.through("w") == 0 and gate.held() == 0


async def test_the_budget_holds_only_while_the_fleet_is_contended() -> None:
    contended = [False]
    gate = WorkerGate(prefill_budget=100, contended=lambda: contended[0])
    first = await enter_paced(gate, "w", 100)
    second = await enter_paced(gate, "w", 100)  # nobody competes: both prefill in one step
    assert gate.prefill_pending("w") == 200
    contended[0] = True
    third = start_paced(gate, "w", 100)
    await settle()
    assert not third.done()
    first.prefilled()  # still 100 pending: over the budget with the third
    await settle()
    assert not third.done()
    second.prefilled()
    await settle()
    assert third.done()
    for p in (first, second, third.result()):
        p()
    assert gate.prefill_pending("w") == 0


def reserving(lighter: set[str], budget: int = 500) -> WorkerGate:
    """A gate with the prefill reservation, where every key but those in ``lighter`` yields."""
    return WorkerGate(prefill_budget=budget, prefill_reserve=True,
                      yields_prefill=lambda tenant: tenant not in lighter)


async def test_prefill_reservation_keeps_one_worker_free_of_a_heavier_keys_cold_prompts() -> None:
    gate = reserving({"light"})
    assert gate.cold_tokens == 250
    first = await enter_paced(gate, "w1", 600, "heavy")
    assert gate.cold_pending("w1") == 1 and gate.reserves_for("light") and not gate.reserves_for("heavy")
    warm = await enter_paced(gate, "w2", 64, "heavy")  # a warm prompt is no cold prefill: it passes
    assert gate.cold_pending("w2") == 0
    warm.prefilled()
    held = start_paced(gate, "w2", 600, "heavy")  # the last worker with no cold prefill: kept for light
    await settle()
    assert not held.done() and gate.reserved == 1 and gate.held("w2") == 1
    light = await enter_paced(gate, "w2", 600, "light")  # light's cold prompt passes there at once
    assert gate.cold_pending("w2") == 1 and not held.done()
    light.prefilled()  # w2's budget is free again, but w2 is still the only worker with no cold prefill
    await settle()
    assert not held.done()
    first.prefilled()  # w1's cold prefill ends: w1 is free, so w2 may take heavy's
    await settle()
    assert held.done() and gate.cold_pending("w1") == 0 and gate.cold_pending("w2") == 1
    for p in (first, warm, light, held.result()):
        p()
    assert gate.cold_pending("w2") == 0 and gate.prefill_pending("w2") == 0 and gate.through("w2") == 0


async def test_prefill_reservation_holds_nothing_without_a_lighter_key_or_a_second_worker() -> None:
    alone = reserving({"heavy", "light"})  # no key is lighter than any other
    passes = [await enter_paced(alone, w, 600, "heavy") for w in ("w1", "w2")]
    assert alone.reserved == 0 and alone.cold_pending("w1") == alone.cold_pending("w2") == 1
    one = reserving({"light"})
    passes.append(await enter_paced(one, "w", 600, "heavy"))  # its only worker: nothing to keep free
    off = WorkerGate(prefill_budget=500, yields_prefill=lambda tenant: True)
    passes += [await enter_paced(off, w, 600, "heavy") for w in ("w1", "w2")]
    assert off.cold_pending("w1") == 0 and not off.reserves_for("light")  # the rule off: no cold count
    for p in passes:
        p()


async def test_a_held_cold_prompt_passes_once_no_lighter_key_is_active() -> None:
    lighter = {"light"}
    gate = WorkerGate(prefill_budget=500, prefill_reserve=True, yields_prefill=lambda tenant: tenant not in lighter)
    first = await enter_paced(gate, "w1", 600, "heavy")
    held = start_paced(gate, "w2", 600, "heavy")
    await settle()
    assert not held.done()
    lighter.add("heavy")  # the light key left: heavy is the lightest there is
    first()  # the next event on any worker looks again
    await settle()
    assert held.done()
    held.result()()
    assert gate.cold_pending("w2") == 0 and gate.held() == 0


async def test_prefill_reservation_paces_cold_prompts_one_per_worker_even_uncontended() -> None:
    gate = WorkerGate(prefill_budget=500, prefill_reserve=True, contended=lambda: False)
    first = await enter_paced(gate, "w1", 600, "solo")
    other = await enter_paced(gate, "w2", 600, "solo")  # another worker's prefill is its own
    warm = await enter_paced(gate, "w1", 64, "solo")  # a warm prompt joins the cold one's step
    held = start_paced(gate, "w1", 600, "solo")  # a second cold prefill on w1 waits in the gate
    await settle()
    assert not held.done() and gate.paced == 1 and gate.cold_pending("w1") == 1 and gate.reserved == 0
    other.prefilled()  # another worker's cold prefill ending does not free w1's
    await settle()
    assert not held.done()
    first.prefilled()
    await settle()
    assert held.done() and gate.cold_pending("w1") == 1
    for p in (first, other, warm, held.result()):
        p()
    assert gate.cold_pending("w1") == 0 and gate.prefill_pending("w1") == 0 and gate.through("w1") == 0


async def test_a_held_cold_prompt_of_a_light_key_goes_before_a_heavier_keys() -> None:
    gate = WorkerGate(prefill_budget=500, prefill_reserve=True, share_first=True, contended=lambda: False,
                      below_share=lambda tenant: tenant == "light",
                      yields_prefill=lambda tenant: tenant != "light")
    first = await enter_paced(gate, "w", 600, "heavy")
    heavy = start_paced(gate, "w", 600, "heavy")
    await settle()
    light = start_paced(gate, "w", 600, "light")  # came later, waits in the gate, not in the worker's queue
    await settle()
    assert not heavy.done() and not light.done()
    first.prefilled()
    await settle()
    assert light.done() and not heavy.done()
    light.result().prefilled()
    await settle()
    assert heavy.done()
    for p in (first, light.result(), heavy.result()):
        p()



async def test_has_room_counts_the_reserved_slots_only_for_a_key_below_its_share() -> None:
    gate = WorkerGate(reserve=1, below_share=lambda tenant: tenant == "light")
    assert gate.has_room("w", "heavy")  # nothing entered yet: room
    passes = [await enter_as(gate, "w", 3, "heavy") for _ in range(2)]
    assert not gate.has_room("w", "heavy") and gate.has_room("w", "light")
    passes.append(await enter_as(gate, "w", 3, "light"))
    assert not gate.has_room("w", "light")
    for p in passes:
        p()


async def test_with_warm_reroute_only_a_running_slot_is_room_for_a_key_below_its_share() -> None:
    for reroute, room_in_headroom in ((False, True), (True, False)):
        gate = WorkerGate(headroom=1, prefill_budget=500, prefill_reserve=True, warm_reroute=reroute,
                          below_share=lambda tenant: tenant == "light")  # fmt: skip
        passes = [await enter_as(gate, "w", 2, "heavy") for _ in range(2)]  # both running slots taken
        assert gate.has_room("w", "light") is room_in_headroom  # the headroom past them is a wait on the worker
        for p in passes:
            p()
    assert not WorkerGate(warm_reroute=True).warm_reroute  # only with the prefill reservation
