"""The router: pools per (model, role), the one resolution of a pinned target worker, and
its live routing quality (offered prompts, finishes reported through the lease, the
tokenizer-fidelity guard switching a model to load-only routing, cache-parameter changes)."""

from __future__ import annotations

import asyncio
import dataclasses
import logging

import pytest

from gateway.pipeline.lease import Lease, Outcome
from gateway.pipeline.offpath import run_pending
from gateway.pipeline.router import Selection, slot_bounded
from gateway.pipeline.worker_gate import CALLER, WorkerGate
from gateway.policies.base import NoWorkerAvailable, RouteRequest, WorkerView
from gateway.policies.cache_aware import CacheAwarePolicy
from gateway.policies.common import TARGET_REASON
from tests.fake_transport import MODEL, FakeTransport, Fleet, fleet

SYSTEM = list(range(1000, 1512))


def pinned(target: str | None = None, exclude: frozenset[str] = frozenset()) -> RouteRequest:
    return RouteRequest(token_ids=[1, 2], model=MODEL, request_id="t", target_worker=target, exclude=exclude)


@pytest.mark.parametrize("target", ["b:1", "grpc://b:1", "grpc://b:1/"])
async def test_a_target_is_found_by_id_or_url(target: str) -> None:
    f = await fleet(FakeTransport("grpc://a:1"), FakeTransport("grpc://b:1"))
    chosen = f.router.select(pinned(target))
    assert chosen.worker.id == "b:1" and chosen.decision.reason == TARGET_REASON


async def test_a_target_that_already_failed_this_request_is_not_retried() -> None:
    f = await fleet(FakeTransport("grpc://a:1"), FakeTransport("grpc://b:1"))
    with pytest.raises(NoWorkerAvailable, match="already failed"):
        f.router.select(pinned("b:1", exclude=frozenset({"b:1"})))


async def test_unknown_draining_or_other_pool_targets_are_refused() -> None:
    f = await fleet(FakeTransport("grpc://a:1"), FakeTransport("grpc://d:1", role="decode"))
    with pytest.raises(NoWorkerAvailable, match="not in pool"):
        f.router.select(pinned("zz:9"))
    with pytest.raises(NoWorkerAvailable, match="not in pool"):
        f.router.select(pinned("d:1"))  # a decode worker is not in the regular pool
    f.worker("a:1").draining = True
    with pytest.raises(NoWorkerAvailable):
        f.router.select(pinned("a:1"))


async def test_unavailable_target_says_so() -> None:
    f = await fleet(FakeTransport("grpc://a:1"))
    f.worker("a:1").healthy = False
    with pytest.raises(NoWorkerAvailable, match="unavailable"):
        f.router.select(pinned("a:1"))


async def test_without_target_excluded_workers_are_skipped() -> None:
    f = await fleet(FakeTransport("grpc://a:1"), FakeTransport("grpc://b:1"))
    assert {f.router.select(pinned(exclude=frozenset({"a:1"}))).worker.id for _ in range(4)} == {"b:1"}
    with pytest.raises(NoWorkerAvailable, match="no regular worker"):
        f.router.select(pinned(exclude=frozenset({"a:1", "b:1"})))


async def test_the_pool_memo_follows_every_write_that_changes_who_is_in_it() -> None:
    f = await fleet(FakeTransport("grpc://a:1"), FakeTransport("grpc://b:1"), FakeTransport("grpc://c:1"))

    def chosen() -> set[str]:
        return {f.router.select(pinned()).worker.id for _ in range(6)}  # round robin: every live worker

    assert chosen() == {"a:1", "b:1", "c:1"}
    f.worker("a:1").draining = True
    assert chosen() == {"b:1", "c:1"}
    f.worker("b:1").role = "decode"
    assert chosen() == {"c:1"}
    f.worker("b:1").role = "regular"
    f.worker("a:1").draining = False
    assert chosen() == {"a:1", "b:1", "c:1"}
    f.worker("c:1").info.model = "other"  # the info changed in place
    assert chosen() == {"a:1", "b:1"}
    await f.registry.remove("a:1", drain_timeout_s=0)
    assert chosen() == {"b:1"}
    await f.registry.add("grpc://c:1")  # known: the same worker, no new member
    f.worker("c:1").info = dataclasses.replace(f.worker("c:1").info, model=MODEL)
    assert chosen() == {"b:1", "c:1"}


def route(i: int, n: int = 32) -> RouteRequest:
    return RouteRequest(token_ids=[*SYSTEM, *range(10_000 + i * n, 10_000 + (i + 1) * n)], model=MODEL,
                        request_id=f"r{i}", max_new_tokens=4)


def run_one(f, r: RouteRequest, *, cached: int, reported_prompt: int) -> None:  # type: ignore[no-untyped-def]
    lease = Lease(f.router, f.router.select(r), r, prompt_tokens=len(r.token_ids), max_new_tokens=4)
    lease.start()
    lease.report(cached_tokens=cached, prompt_tokens=reported_prompt)
    lease.end(Outcome.OK)


async def test_offered_ideal_achieved_and_predicted_per_pool() -> None:
    f = await fleet(FakeTransport("grpc://w1:1"), FakeTransport("grpc://w2:1"), policy="cache_aware")
    for i in range(4):
        r = route(i)
        run_one(f, r, cached=512 if i else 0, reported_prompt=len(r.token_ids))
    run_pending()  # offers are applied off the request's path (pipeline.offpath)
    q = f.router.quality(MODEL, "regular")
    assert q.offered.prompts == 4 and q.offered.prompt_tokens == 4 * 544
    assert q.offered.ideal_cached_tokens == 3 * 512  # every repeat of the system prompt
    assert q.finished == 4 and q.reported_cached_tokens == 3 * 512
    assert q.predicted_cached_tokens == 3 * 512  # the tree sent each repeat to the holder
    retry = dataclasses.replace(route(9), exclude=frozenset({"w1:1"}))
    f.router.select(retry)
    run_pending()
    assert q.offered.prompts == 4  # a retry offers nothing new
    assert f.router.qualities() == {(MODEL, "regular"): q}


async def test_tokenizer_mismatch_trips_load_only_routing_and_agreement_clears_it(
    caplog: pytest.LogCaptureFixture,
) -> None:
    f = await fleet(FakeTransport("grpc://w1:1"), FakeTransport("grpc://w2:1"), policy="cache_aware")
    policy = f.router.policy(MODEL, "regular")
    assert isinstance(policy, CacheAwarePolicy)
    caplog.set_level(logging.WARNING, logger="gateway.pipeline.router")
    for i in range(3):  # the worker counts one token more than we sent (its own BOS, say)
        r = route(i)
        run_one(f, r, cached=0, reported_prompt=len(r.token_ids) + 1)
    q = f.router.quality(MODEL, "regular")
    assert q.guard.tripped and q.guard.mismatches == 3
    assert MODEL in policy.load_only
    assert f.router.select(route(7)).decision.reason == "no_match"  # the tree is not consulted
    assert sum("routing it by load only" in rec.message for rec in caplog.records) == 1
    for i in range(10, 10 + q.guard.clear_after):
        r = route(i)
        run_one(f, r, cached=0, reported_prompt=len(r.token_ids))
    assert not q.guard.tripped and MODEL not in policy.load_only
    assert sum("counts agree again" in rec.message for rec in caplog.records) == 1


async def test_a_worker_whose_page_size_changes_is_logged_and_counted(caplog: pytest.LogCaptureFixture) -> None:
    f = await fleet(FakeTransport("grpc://w1:1"), policy="cache_aware")
    caplog.set_level(logging.WARNING, logger="gateway.pipeline.router")
    f.router.select(route(0))
    w = f.worker("w1:1")
    if w.info.kv_capacity_tokens <= 0:
        w.info = dataclasses.replace(w.info, kv_capacity_tokens=4096)
        f.router.select(route(1))
    w.info = dataclasses.replace(w.info, page_size=w.info.page_size * 2)
    f.router.select(route(2))
    assert f.router.cache_param_changes == {"w1:1": 1}
    assert sum("page size" in rec.message for rec in caplog.records) == 1


async def test_all_breakers_open_routes_among_the_healthy() -> None:
    route = RouteRequest(token_ids=[1, 2, 3], model=MODEL, request_id="q1")
    f = await fleet(FakeTransport("grpc://a:1"), FakeTransport("grpc://b:1"))
    a, b = f.worker("a:1"), f.worker("b:1")
    a.breaker.trip("watchdog")
    assert f.router.select(route).worker is b  # one closed breaker: it alone is chosen
    b.breaker.trip("watchdog")
    assert f.router.select(route).worker in (a, b)  # none closed: panic, not a 503
    a.healthy = False
    assert f.router.select(route).worker is b  # health still rules out a down worker
    b.healthy = False
    with pytest.raises(NoWorkerAvailable):
        f.router.select(route)


def test_slot_bounded_offers_full_workers_only_when_every_worker_is_full() -> None:
    def view(name: str, in_flight: int, cap: int = 2, available: bool = True) -> WorkerView:
        return WorkerView(name, f"grpc://{name}", in_flight=in_flight, max_running_requests=cap, available=available)

    views = [view("a", 2), view("b", 1), view("c", 5, cap=0), view("d", 0, available=False)]
    bounded = slot_bounded(views, 0)
    assert [v.available for v in bounded] == [False, True, True, False]  # c reports no cap: never full
    assert [v.available for v in slot_bounded(views, 1)] == [True, True, True, False]  # a has 2 + 1 slots
    all_full = [view("a", 2), view("b", 3), view("d", 0, available=False)]
    assert slot_bounded(all_full, 0) is all_full  # nowhere better: the policy decides among all


async def _full_holder() -> tuple[Fleet, RouteRequest, Selection]:
    """Three workers of one running slot each; a 512-token prompt's holder has its slot taken."""
    f = await fleet(*(FakeTransport(f"grpc://{n}:1") for n in "abc"), policy="cache_aware")
    for w in f.registry.all():
        w.info = dataclasses.replace(w.info, max_running_requests=1)
    prompt = RouteRequest(list(range(512)), model=MODEL)
    first = f.router.select(prompt)
    first.policy.on_dispatch(prompt, first.decision)
    first.worker.load.acquire(64, 1)  # the prefix's worker has its one running slot taken
    return f, prompt, first


async def test_with_a_worker_gate_the_router_keeps_a_full_workers_prefix() -> None:
    f, prompt, first = await _full_holder()
    f.router.slot_headroom = 0
    assert f.router.select(prompt).worker.id != first.worker.id  # the hard bound sends it away, cold
    f.router.gate = WorkerGate()  # the request waits for the holder's slot in the gateway instead
    assert f.router.select(prompt).worker.id == first.worker.id


async def test_with_fair_spill_a_key_below_its_share_leaves_a_full_holder_for_a_free_slot() -> None:
    f, prompt, first = await _full_holder()
    f.router.slot_headroom = 0
    below = {"light"}
    f.router.gate = WorkerGate(fair_spill=True, below_share=lambda tenant: tenant in below)

    async def chosen_for(tenant: str) -> str:
        async def pick() -> str:
            CALLER.set((tenant, 0))  # admission sets it in the request's own task
            return f.router.select(prompt).worker.id

        return await asyncio.create_task(pick())

    assert await chosen_for("heavy") == first.worker.id  # at its share: it waits for the holder's slot
    assert await chosen_for("light") != first.worker.id  # below its share: a free running slot, cold
    f.router.gate = WorkerGate(below_share=lambda tenant: tenant in below)
    assert await chosen_for("light") == first.worker.id  # without fair_spill locality decides alone
    for w in f.registry.all():
        if w is not first.worker:
            w.load.acquire(64, 1)
    f.router.gate = WorkerGate(fair_spill=True, below_share=lambda tenant: tenant in below)
    assert await chosen_for("light") == first.worker.id  # every worker full: locality again


async def test_with_prefill_reservation_a_light_keys_cold_prompt_goes_where_no_cold_prefill_is_pending() -> None:
    f = await fleet(*(FakeTransport(f"grpc://{n}:1") for n in "abc"), policy="cache_aware")
    for w in f.registry.all():
        w.info = dataclasses.replace(w.info, max_running_requests=8)
    warm = RouteRequest(list(range(512)), model=MODEL)
    first = f.router.select(warm)
    first.policy.on_dispatch(warm, first.decision)  # light's prefix is cached on ``first``
    light_active = [True]
    gate = WorkerGate(prefill_budget=500, prefill_reserve=True,
                      yields_prefill=lambda tenant: tenant != "light" and light_active[0])
    f.router.gate = gate
    gate.know(w.id for w in f.registry.all())  # the router tells it the pool on its first choice
    others = sorted(w.id for w in f.registry.all() if w is not first.worker)
    passes = []
    for worker in (first.worker.id, others[0]):  # a heavier key's cold prefills pending on two of three
        CALLER.set(("heavy", 0))
        passes.append(await gate.enter(worker, 8, 600))

    async def chosen_for(tenant: str, request: RouteRequest) -> str:
        async def pick() -> str:
            CALLER.set((tenant, 0))
            return f.router.select(request).worker.id

        return await asyncio.create_task(pick())

    colds = [RouteRequest(list(range(1000 * i, 1000 * i + 512)), model=MODEL) for i in range(1, 7)]
    assert {await chosen_for("light", cold) for cold in colds} == {others[1]}  # the worker kept free
    assert await chosen_for("light", warm) == first.worker.id  # warm: its prefix's worker, as before
    light_active[0] = False  # (while it is, heavy's cold prompt would wait for the last free worker)
    CALLER.set(("heavy", 0))
    passes.append(await asyncio.wait_for(gate.enter(others[1], 8, 600), 1))
    light_active[0] = True  # every worker prefilling: locality and load decide
    assert len({await chosen_for("light", cold) for cold in colds}) > 1
    for p in passes:
        p()


async def test_a_light_keys_cold_prompt_goes_where_it_has_a_running_slot() -> None:
    f = await fleet(*(FakeTransport(f"grpc://{n}:1") for n in "abc"), policy="cache_aware")
    for w in f.registry.all():
        w.info = dataclasses.replace(w.info, max_running_requests=2)
    gate = WorkerGate(prefill_budget=500, prefill_reserve=True, yields_prefill=lambda tenant: tenant != "light")
    f.router.gate = gate
    gate.know(w.id for w in f.registry.all())
    ids = sorted(w.id for w in f.registry.all())
    passes = []
    CALLER.set(("heavy", 0))
    passes.append(await gate.enter(ids[0], 2, 600))  # a cold prefill pending on the first
    passes += [await gate.enter(ids[1], 2, 10) for _ in range(2)]  # the second's slots all taken, warm

    async def chosen_for(tenant: str, request: RouteRequest) -> str:
        async def pick() -> str:
            CALLER.set((tenant, 0))
            return f.router.select(request).worker.id

        return await asyncio.create_task(pick())

    colds = [RouteRequest(list(range(1000 * i, 1000 * i + 512)), model=MODEL) for i in range(1, 7)]
    assert {await chosen_for("light", cold) for cold in colds} == {ids[2]}  # no cold prefill and a slot
    assert len({await chosen_for("heavy", cold) for cold in colds}) > 1  # a yielding key: the policy decides
    for p in passes:
        p()


async def test_with_a_slot_headroom_the_router_avoids_a_full_worker() -> None:
    f = await fleet(*(FakeTransport(f"grpc://{n}:1") for n in "abc"), policy="cache_aware")
    for w in f.registry.all():
        w.info = dataclasses.replace(w.info, max_running_requests=1)
    prompt = RouteRequest(list(range(64)), model=MODEL)
    first = f.router.select(prompt)
    first.worker.load.acquire(64, 1)  # the one running slot of the prefix's worker is taken
    f.router.slot_headroom = 0
    assert all(f.router.select(prompt).worker.id != first.worker.id for _ in range(6))
    for w in f.registry.all():
        if w is not first.worker:
            w.load.acquire(64, 1)
    assert {f.router.select(prompt).worker.id for _ in range(6)} <= {w.id for w in f.registry.all()}  # all full: any


async def test_a_failed_rank_excludes_its_whole_engine() -> None:
    f = await fleet(FakeTransport("grpc://a:1", server_args={"dp_size": 2}), FakeTransport("grpc://b:1"))
    assert {w.id for w in f.registry.all()} == {"a:1@0", "a:1@1", "b:1"}
    assert {f.router.select(pinned(exclude=frozenset({"a:1@1"}))).worker.id for _ in range(4)} == {"b:1"}
    assert f.router.select(pinned("a:1@1")).worker.id == "a:1@1"  # a rank can be pinned by id
    with pytest.raises(NoWorkerAvailable, match="no regular worker"):
        f.router.select(pinned(exclude=frozenset({"a:1@0", "b:1"})))


async def test_a_tapped_router_runs_its_before_select_hook_ahead_of_every_choice() -> None:
    """Same-host sync applies what the sibling processes decided just before each choice."""
    f = await fleet(FakeTransport("grpc://a:1"), FakeTransport("grpc://b:1"), policy="cache_aware")
    calls: list[str] = []

    class _Sink:
        def dispatched(self, *a: object) -> None:
            calls.append("dispatched")

        def finished(self, *a: object) -> None:
            calls.append("finished")

        def learned(self, *a: object) -> None:
            calls.append("learned")

    f.router.tap(_Sink(), before_select=lambda: calls.append("before"))
    chosen = f.router.select(route(0))
    assert calls == ["before"]
    chosen.policy.on_dispatch(route(0), chosen.decision)
    assert calls == ["before", "dispatched"]


async def test_with_warm_reroute_a_light_keys_warm_request_leaves_a_worker_with_no_running_slot() -> None:
    f = await fleet(*(FakeTransport(f"grpc://{n}:1") for n in "abc"), policy="cache_aware")
    for w in f.registry.all():
        w.info = dataclasses.replace(w.info, max_running_requests=2)
    warm = RouteRequest(list(range(512)), model=MODEL)
    first = f.router.select(warm)
    first.policy.on_dispatch(warm, first.decision)  # light's prefix is cached on ``first``

    async def chosen_for(tenant: str, request: RouteRequest) -> str:
        async def pick() -> str:
            CALLER.set((tenant, 0))
            return f.router.select(request).worker.id

        return await asyncio.create_task(pick())

    for reroute in (False, True):
        gate = WorkerGate(headroom=1, prefill_budget=500, prefill_reserve=True, warm_reroute=reroute,
                          yields_prefill=lambda tenant: tenant != "light",
                          below_share=lambda tenant: tenant == "light")  # fmt: skip
        f.router.gate = gate
        gate.know(w.id for w in f.registry.all())
        CALLER.set(("heavy", 0))
        passes = [await gate.enter(first.worker.id, 2, 10) for _ in range(2)]  # its running slots: heavy's
        assert await chosen_for("heavy", warm) == first.worker.id  # a yielding key: locality, as before
        light = await chosen_for("light", warm)
        assert (light != first.worker.id) is reroute  # without the flag it waits there for a slot
        for p in passes:
            p()
        assert await chosen_for("light", warm) == first.worker.id  # a slot free again: its prefix's worker
