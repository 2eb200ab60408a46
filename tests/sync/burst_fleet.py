"""A gsp burst against a small model of a simulated fleet, routed request by request by
one or more gateway processes' own routing state: what the burst witnesses share (a
``serve --processes 2`` set on one host, two replicas on the bus).

The workers are a small model of the simulator: a FIFO waiting queue, ``MAX_RUNNING``
running slots, a chunked-prefill budget per step, a prefix LRU of the build's KV capacity,
and the load poll's ``num_waiting_uncached_tokens`` (waiting prompts priced at the cache
as it is), fed to every process's ``Worker.polled`` every few requests. Steps come
rarely (a burst routed faster than the fleet prefills, as on a host with a free core per
process), so the workers' queues are long. The routing state is the gateway's own: per
process a ``CacheAwarePolicy`` over real ``Worker`` objects (their ``view()``), tapped
into whatever the process publishes through (``Member.tap``). Request ``i`` goes to
process ``i % N`` (the kernel hands a set's connections out in turn; a balancer
alternates between replicas); every ``BUS_EVERY`` requests the caller's ``exchange``
carries what the processes published to each other.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from types import SimpleNamespace

from gateway.policies.base import LoadSnapshot, RouteRequest
from gateway.policies.cache_aware import CacheAwarePolicy, CostKnobs
from gateway.policies.prefill_gate import DEFAULT_MIN_GAIN_TOKENS, PrefillGate, slot_free
from gateway.sync.host_prefill import HostPrefill
from gateway.sync.host_ring import HostRing
from gateway.sync.outbox import Outbox
from gateway.sync.policy_tap import FanOut, TappedPolicy
from gateway.workers.load import LoadGuard, WorkerLoad
from gateway.workers.worker import Worker, WorkerInfo
from tests.fake_transport import FakeTransport

GROUPS, PER_GROUP, WORKERS = 64, 16, 8
SYSTEM, QUESTION, OUTPUT, MAX_RUNNING = 2048, 128, 128, 16
STEP_EVERY = 128  # requests routed between two fleet steps
POLL_EVERY = 16  # ... between two load polls
BUS_EVERY = 16  # ... between two bus ticks
STEP_PREFILL_TOKENS = 8192  # a step's chunked-prefill budget
STEP_DECODE_TOKENS = 8


@dataclass
class Build:
    page: int
    capacity: int


BUILDS = {"A": Build(16, 40960), "B": Build(32, 30000)}


def _worker(i: int, build: Build) -> Worker:
    url = f"grpc://127.0.0.1:{5000 + i}"
    info = WorkerInfo(model="m", page_size=build.page, kv_capacity_tokens=build.capacity, max_running_requests=MAX_RUNNING)
    return Worker(url, FakeTransport(url), info)  # type: ignore[arg-type]


class Member:
    """One serving process's routing state, wired as ``server.state`` wires it: ``router``
    and ``registry`` are what an ``Applier`` (or a ``SyncBus``) applies the others' news to."""

    def __init__(self, build: Build, cost: CostKnobs | None = None) -> None:
        self.build = build
        self.workers = {w.id: w for w in (_worker(i, build) for i in range(WORKERS))}
        self.policy = CacheAwarePolicy(eviction_interval_s=0, cost=cost)
        self.policy.on_workers_changed([w.view() for w in self.workers.values()])
        self.router = SimpleNamespace(policy=lambda model, role: self.policy)
        self.registry = SimpleNamespace(get=self.workers.get, all=lambda: list(self.workers.values()))
        self.outbox: Outbox | None = None
        self.ring: HostRing | None = None
        self.prefill: HostPrefill | None = None
        self.tapped: TappedPolicy | None = None
        self.reasons: Counter[str] = Counter()
        self._keys = 0
        # The prefill gate's rule over this process's requests in prefill and (through the
        # prefill ring) its siblings', and what its free-slot check says at each request that
        # has a blocker: (from the bus's in-flight alone, the gate's own count, the truth).
        self.gate = PrefillGate()
        self.gate_checks: Counter[tuple[bool, bool, bool]] = Counter()
        self.others: list[Member] = []

    def load(self, worker_id: str) -> WorkerLoad | None:
        w = self.workers.get(worker_id)
        return None if w is None else w.load

    def tap(self, outbox: Outbox, ring: HostRing | None = None, prefill: HostPrefill | None = None) -> None:
        """Publish every decision into ``outbox`` (and the same-host decision ring), and
        each request in prefill into the same-host prefill ring."""
        self.outbox, self.ring, self.prefill = outbox, ring, prefill
        self.tapped = TappedPolicy(self.policy, "regular", outbox if ring is None else FanOut(outbox, ring))  # type: ignore[arg-type]

    def sibling_queued(self, worker_id: str, tokens: int) -> None:
        """``HostPrefill``'s ``on_queued``, as ``server.state`` sets it."""
        self.workers[worker_id].sibling_queued_prompt_tokens = tokens

    def sibling_in_flight(self, worker_id: str, requests: int) -> None:
        """``HostPrefill``'s ``on_in_flight``, as ``server.state`` sets it."""
        self.workers[worker_id].sibling_in_flight = requests

    def route(self, request: RouteRequest) -> tuple[str, LoadGuard, int]:
        assert self.tapped is not None and self.outbox is not None
        if self.ring is not None and self.prefill is not None:  # the router's before_select
            self.ring.poll()
            self.prefill.poll()
        decision = self.tapped.select(request, [w.view() for w in self.workers.values()])
        self.tapped.on_dispatch(request, decision)
        self.reasons[decision.reason] += 1
        wid = decision.worker_id
        guard = self.workers[wid].load.acquire(len(request.token_ids), OUTPUT)
        self.outbox.load_changed(wid)
        self._keys += 1
        packed = self.policy.packed(request) or b""
        self._check_gate(wid, packed, decision.predicted_cached_tokens)
        self.gate.add(self._keys, wid, packed, decision.predicted_cached_tokens)
        if self.prefill is not None:
            self.prefill.sent(self._keys, wid, packed, decision.predicted_cached_tokens)
        return wid, guard, self._keys

    def _check_gate(self, wid: str, packed: bytes, cached: int) -> None:
        w = self.workers[wid]
        if self.gate.blocker(wid, packed, cached, min_gain_tokens=DEFAULT_MIN_GAIN_TOKENS, page=self.build.page) is None:
            return
        true = sum(o.workers[wid].load.in_flight for o in self.others)
        mine = w.load.in_flight - 1  # the model holds no request: every lease is on its worker
        gate = mine + w.sibling_in_flight + w.peer_in_flight  # ``PrefillHolds.on_worker`` with nothing held
        self.gate_checks[(
            slot_free(mine + w.remote_load.in_flight, MAX_RUNNING),
            slot_free(gate, MAX_RUNNING),
            slot_free(mine + true, MAX_RUNNING),
        )] += 1

    def first_token(self, wid: str, guard: LoadGuard, key: int) -> None:
        assert self.outbox is not None
        guard.first_token()
        self.gate.remove(key)
        self.outbox.load_changed(wid)
        if self.prefill is not None:
            self.prefill.done(key)

    def released(self, wid: str, guard: LoadGuard, key: int) -> None:
        assert self.outbox is not None
        guard.release()
        self.outbox.load_changed(wid)
        if self.prefill is not None:
            self.prefill.ended(key)

    def close(self) -> None:
        for part in (self.ring, self.prefill):
            if part is not None:
                part.close()
        self.policy.close()


@dataclass
class _Queued:
    group: int
    prompt: int
    member: Member
    guard: LoadGuard
    key: int
    decode: int = OUTPUT


@dataclass
class _FleetWorker:
    capacity: int
    waiting: list[_Queued] = field(default_factory=list)
    running: list[_Queued] = field(default_factory=list)
    cache: dict[int, int] = field(default_factory=dict)  # group -> step last used (LRU)

    def snapshot(self) -> LoadSnapshot:
        uncached = sum(q.prompt - (SYSTEM if q.group in self.cache else 0) for q in self.waiting)
        return LoadSnapshot(num_running_reqs=len(self.running), num_waiting_reqs=len(self.waiting),
                            num_waiting_uncached_tokens=uncached, max_total_num_tokens=self.capacity)  # fmt: skip


@dataclass
class Placement:
    spread: float  # prompt groups' mean count of workers
    reasons: Counter[str]  # the routing reasons, summed over the processes
    gate_checks: Counter[tuple[bool, bool, bool]]  # see ``Member.gate_checks``, summed
    duplicates: int = 0  # requests admitted in the step that first prefilled their group on their worker

    @property
    def spills(self) -> int:
        """Choices away from a known holder for its load."""
        return self.reasons["load_balanced"]


def gsp_burst(seed: int = 7) -> list[tuple[int, list[int]]]:
    """(group, prompt) of every request, shuffled."""
    rng = random.Random(seed)
    systems = [[rng.randrange(1, 50_000) for _ in range(SYSTEM)] for _ in range(GROUPS)]
    burst = [(g, systems[g] + [rng.randrange(1, 50_000) for _ in range(QUESTION)]) for g in range(GROUPS) for _ in range(PER_GROUP)]
    rng.shuffle(burst)
    return burst


async def run_burst(
    members: Sequence[Member], exchange: Callable[[], Awaitable[None]] | None = None, bus_every: int = BUS_EVERY
) -> Placement:
    """Route one burst through ``members`` in turn; ``exchange`` every ``bus_every`` requests
    (the bus's lag, in requests routed meanwhile)."""
    build = members[0].build
    for m in members:
        m.others = [o for o in members if o is not m]
    ids = list(members[0].workers)
    fleet = {wid: _FleetWorker(build.capacity) for wid in ids}
    placed: dict[int, set[str]] = {}
    clock = 0
    duplicates = 0

    def step() -> None:
        nonlocal clock, duplicates
        clock += 1
        for wid, fw in fleet.items():
            for q in list(fw.running):
                q.decode -= STEP_DECODE_TOKENS
                if q.decode <= 0:
                    fw.running.remove(q)
                    q.member.released(wid, q.guard, q.key)
            budget, prefilled = STEP_PREFILL_TOKENS, set()
            while fw.waiting and len(fw.running) < MAX_RUNNING and budget > 0:
                q = fw.waiting.pop(0)
                if q.group not in fw.cache and q.group in prefilled:
                    duplicates += 1  # an in-batch duplicate: its group's prefix is computed twice in this step
                cached = SYSTEM if q.group in fw.cache and q.group not in prefilled else 0
                budget -= q.prompt - cached
                prefilled.add(q.group)
                q.member.first_token(wid, q.guard, q.key)
                fw.running.append(q)
            for g in prefilled:
                fw.cache[g] = clock
            while len(fw.cache) * SYSTEM > fw.capacity:
                del fw.cache[min(fw.cache, key=fw.cache.__getitem__)]

    for i, (group, tokens) in enumerate(gsp_burst()):
        member = members[i % len(members)]
        request = RouteRequest(token_ids=tokens, model="m", request_id=f"r{i}", max_new_tokens=OUTPUT)
        wid, guard, key = member.route(request)
        placed.setdefault(group, set()).add(wid)
        fleet[wid].waiting.append(_Queued(group, len(tokens), member, guard, key))
        if (i + 1) % STEP_EVERY == 0:
            step()
        if (i + 1) % POLL_EVERY == 0:
            for m in members:
                for wid2, fw in fleet.items():
                    m.workers[wid2].polled, m.workers[wid2].polled_at = fw.snapshot(), 0.0
        if (i + 1) % bus_every == 0 and exchange is not None:
            await exchange()
    while any(fw.waiting or fw.running for fw in fleet.values()):
        step()
    reasons = sum((m.reasons for m in members), Counter[str]())
    checks = sum((m.gate_checks for m in members), Counter[tuple[bool, bool, bool]]())
    return Placement(sum(len(s) for s in placed.values()) / GROUPS, reasons, checks, duplicates)
