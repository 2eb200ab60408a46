"""`token-gateway bench fairness-replay`: the fairness runs replayed on a virtual clock.

    token-gateway bench fairness-replay --fleets sim sim-alt --queues 1:3:512 1:3:512+gate-share-first --no-shares

The same settings, runs and table as ``bench fairness``.

Why: the bench's own runs put a real gateway before a simulated fleet in real time, and
the light key's tail there is a few slow requests out of ninety: on a loaded host the
host's stalls decide it, not the rule. This replay makes the same decisions with no
sockets and no real clock (``sim.virtual_clock``), so one run takes seconds of CPU and
gives the same figures whatever else the host does.

What is real here: the gateway's admission queue (``server.admission.Admission``), its
worker gate (``pipeline.worker_gate.WorkerGate``), the routing policy, the router's gate
rules (``pipeline.router.slot_bounded`` / ``reserved_prefill``) and each worker's load as
the gateway counts it (``workers.load.WorkerLoad``); the workers are the simulator's own
scheduler (``sim.scheduler``: its step cost model, radix cache and FIFO admission), fed
the same seeded gsp requests at the same Poisson arrival times as the bench's runs.
The serving gateway's prefill gate (``pipeline.prefill_gate.PrefillHolds``: a request waits
while one sharing its prefix is in prefill on its worker) and its load poll (the workers'
own queue figures, ``GetLoads`` every ``load_poll_interval_s``, read by the policy as
``WorkerView.loads``) are modelled as ``serve`` runs them by default; ``--no-replay-prefill-gate``
and ``--replay-load-poll-s 0`` leave them out.
What is left out: the gateway's own time per request (tokenizing, HTTP, gRPC; ``--replay-gateway-ms``
stands in a seeded random delay for it), retries and the watchdog. A request is cut, like the bench's driver cuts it, ``duration_s + grace_s``
after the run's start.
"""

from __future__ import annotations

import argparse
import asyncio
import random
from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import Any

from gateway.pipeline.prefill_gate import PrefillGateConfig, PrefillHolds
from gateway.pipeline.router import reserved_prefill, slot_bounded
from gateway.pipeline.worker_gate import NO_GATE, Pass, WorkerGate
from gateway.policies import PolicyConfig, close_policy, make_policy
from gateway.policies.base import Decision, LoadSnapshot, Policy, RouteRequest, WorkerView
from gateway.protocol.errors import GatewayError
from gateway.server.admission import Admission, AdmissionConfig
from gateway.settings import add_options, from_namespace, option
from gateway.workers.load import WorkerLoad
from gateway.workers.watchdog import ProgressTracker
from gateway_lab.bench.fairness import (
    Cell,
    FairnessConfig,
    append_rows,
    config_of,
    fresh_requests_out,
    parse_queue,
    queue_flags,
    report,
    request_rows,
    row,
    shares,
    tenant_workload,
    ttft_percentile,
)
from gateway_lab.bench.fairness import add_arguments as add_fairness_arguments
from gateway_lab.bench.trace_bench import FLEETS
from gateway_lab.sim.config import SimConfig
from gateway_lab.sim.counters import SimCounters
from gateway_lab.sim.radix_cache import RadixCache
from gateway_lab.sim.sampler import TokenSource, prompt_digest
from gateway_lab.sim.scheduler import Scheduler, Sink
from gateway_lab.sim.scheduler import Sequence as SimSequence
from gateway_lab.sim.virtual_clock import run_virtual
from gateway_lab.sim.vocab import Vocab as SimVocab


@dataclass(slots=True)
class Outcome:
    """One request as the bench's driver reports it (the fields ``fairness``' figures read)."""

    start_s: float
    ok: bool = False
    ttft_s: float | None = None
    latency_s: float | None = None
    prompt_tokens: int = 0
    cached_tokens: int = 0
    worker_id: str | None = None
    admission_s: float | None = None  # waited for an admission slot
    gate_s: float | None = None  # waited in the worker gate
    reason: str | None = None  # the policy's reason; "+moved" when the gate's reservation moved it


@dataclass(slots=True)
class ReplayModel:
    """What of the serving gateway the replay models beyond admission, the gate and the policy."""

    replay_prefill_gate: bool = option(True, "model serve's prefill gate (on by default there): a request waits while one sharing its prefix is in prefill on its worker (--no-replay-prefill-gate: leave it out)")
    replay_load_poll_s: float = option(0.5, "model serve's load poll: the workers' own queue figures the policy reads, taken this many seconds apart as serve's --load-poll-interval-s (0: leave it out)")
    replay_gateway_ms: float = option(20.0, "each request reaches admission a uniform 0..this many ms after it was sent, drawn from the workload's seed: the gateway's own time per request (the default puts the alone p50s where the quiet real-time sittings read them); several values show how much a cell's tail hangs on the order of near-simultaneous arrivals (0: none)")

    def __post_init__(self) -> None:
        if self.replay_load_poll_s < 0:
            raise ValueError("--replay-load-poll-s must be >= 0")
        if self.replay_gateway_ms < 0:
            raise ValueError("--replay-gateway-ms must be >= 0")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_fairness_arguments(parser)
    add_options(parser.add_argument_group("replay model"), ReplayModel)


def admission_config(queue: str, timeout_s: float, weights: list[str]) -> AdmissionConfig:
    """The gateway's admission settings for a ``--queues`` entry (``H:R:B+flag``), as the
    bench passes them to ``serve``; a ``+flag`` must name a switch of admission."""
    headroom, reserve, budget = parse_queue(queue)
    switches = {f.name for f in fields(AdmissionConfig) if f.type in ("bool", bool)}
    config = AdmissionConfig(
        fleet_headroom=headroom, fair_reserve=reserve, prefill_budget_tokens=budget,
        max_queued_requests=100_000, queue_timeout_s=timeout_s, key_weights=weights,
    )  # fmt: skip
    for flag in queue_flags(queue):
        name = flag[2:].replace("-", "_")
        if name not in switches:
            raise ValueError(f"--queues: the replay knows only admission's switches, not {flag}")
        setattr(config, name, True)
    return config


@dataclass(frozen=True, slots=True)
class _Info:
    """The worker facts the prefill gate reads (``Worker.info``'s fields of the same names)."""

    max_running_requests: int
    page_size: int


@dataclass(frozen=True, slots=True)
class _Selection:
    """What the prefill gate reads of a router selection (``pipeline.prefill_gate.Selection``)."""

    worker: ReplayWorker
    decision: Decision
    prompt: bytes
    role: str = "regular"


class ReplayWorker:
    """One simulated worker and the gateway's count of what it has sent there (with the
    fields of ``workers.worker.Worker`` the prefill gate reads: ``load``, the siblings' and
    other replicas' counts, ``info``, ``progress``)."""

    def __init__(self, worker_id: str, sim: SimConfig) -> None:
        self.id = worker_id
        self.sim = sim
        self.cache = RadixCache(sim.page_size, sim.kv_capacity_tokens)
        self.scheduler = Scheduler(sim, self.cache, SimCounters())
        self.load = WorkerLoad()
        self.remote_load = WorkerLoad()  # no sibling processes here: always empty
        self.sibling_in_flight = 0  # nor siblings' or other replicas' requests or prompts
        self.peer_in_flight = 0
        self.sibling_queued_prompt_tokens = 0
        self.info = _Info(sim.max_running_requests, sim.page_size)
        self.progress = ProgressTracker()
        self.polled: LoadSnapshot | None = None
        self.polled_at = 0.0

    def poll(self, now: float) -> None:
        """Take the worker's own load figures as its GetLoads answer gives them
        (``sim.worker``'s ``scheduler_load``: the fields the policies read)."""
        sched, cache = self.scheduler, self.cache
        self.polled = LoadSnapshot(
            num_running_reqs=sched.num_running, num_waiting_reqs=sched.num_waiting,
            num_used_tokens=cache.used_tokens, max_total_num_tokens=cache.capacity,
            token_usage=cache.used_tokens / cache.capacity,
            num_waiting_uncached_tokens=sched.waiting_uncached_tokens(),
        )  # fmt: skip
        self.polled_at = now

    def view(self, now: float = 0.0) -> WorkerView:
        load = self.load
        polled = self.polled
        return WorkerView(
            self.id, f"sim://{self.id}", in_flight=load.in_flight, queued_prefill_tokens=load.queued_prefill_tokens,
            running_decode_tokens=load.running_decode_tokens, kv_capacity_tokens=self.sim.kv_capacity_tokens,
            page_size=self.sim.page_size, max_running_requests=self.sim.max_running_requests,
            loads=None if polled is None else polled.aged(now - self.polled_at),
        )  # fmt: skip


class Replay:
    """One run: a fresh fleet and gateway, each key's requests sent at their arrival times."""

    def __init__(
        self, config: FairnessConfig, sim: SimConfig, admission: AdmissionConfig, vocab: SimVocab,
        model: ReplayModel | None = None,
    ) -> None:
        self.config = config
        self.model = model = model or ReplayModel()
        self.vocab = vocab
        self.holds = PrefillHolds() if model.replay_prefill_gate else None
        self.holds_config = PrefillGateConfig()
        self.workers = [ReplayWorker(f"w{i}", sim) for i in range(config.workers)]
        self.by_id = {w.id: w for w in self.workers}
        self.policy: Policy = make_policy(PolicyConfig(policy=config.policy))
        self.policy.on_workers_changed([w.view() for w in self.workers])
        slots = sim.max_running_requests * len(self.workers)
        weights = {name: weight for name, weight in (item.split("=", 1) for item in admission.key_weights)}
        self.admission = Admission(
            admission, clock=self._now, fleet_slots=lambda: (slots, len(self.workers)),
            weights={k: float(v) for k, v in weights.items()},
        )  # fmt: skip
        self.gate: WorkerGate | None = None
        if admission.fleet_headroom >= 0 and admission.fleet_slot_bound and admission.fleet_slot_wait:
            self.gate = WorkerGate(
                {k: float(v) for k, v in weights.items()}, headroom=admission.fleet_headroom,
                reserve=admission.fair_reserve, prefill_budget=admission.prefill_budget_tokens,
                share_first=admission.gate_share_first, fair_spill=admission.fair_spill,
                prefill_reserve=admission.fair_prefill_reserve, warm_reroute=admission.fair_warm_reroute,
                yields_prefill=self.admission.yields_prefill,
                contended=self.admission.contended, below_share=self.admission.below_share,
                aging_s=admission.priority_aging_s, low_values_first=admission.low_priority_values_first,
                across_tenants=admission.priority_across_keys, clock=self._now,
            )  # fmt: skip
        self.headroom = admission.fleet_headroom if admission.fleet_slot_bound else -1

    @staticmethod
    def _now() -> float:
        return asyncio.get_running_loop().time()

    def _route(self, tenant: str, route: RouteRequest) -> tuple[ReplayWorker, Decision, str]:
        """The worker the router would pick, its decision and the decision's reason."""
        now = self._now()
        views = [w.view(now) for w in self.workers]
        gate = self.gate
        if gate is None and self.headroom >= 0:
            views = slot_bounded(views, self.headroom)
        elif gate is not None and gate.spills(tenant):
            views = slot_bounded(views, 0)
        decision = self.policy.select(route, views)
        reason = decision.reason
        if gate is not None:
            chosen = decision.worker_id
            decision = reserved_prefill(gate, self.policy, route, views, decision)
            reason = decision.reason + ("+moved" if decision.worker_id != chosen else "")
        self.policy.on_dispatch(route, decision)
        return self.by_id[decision.worker_id], decision, reason

    async def request(self, tenant: str, rid: str, ids: list[int], max_new: int, out: Outcome) -> None:
        """One request from admission to its last token (the dispatcher's order of steps)."""
        loop = asyncio.get_running_loop()
        try:
            ticket = await self.admission.acquire(tenant)
        except GatewayError:
            return
        out.admission_s = loop.time() - out.start_s
        route = RouteRequest(ids, request_id=rid, max_new_tokens=max_new)
        worker, decision, out.reason = self._route(tenant, route)
        uncached = max(0, len(ids) - decision.predicted_cached_tokens)
        out.worker_id = worker.id
        guard = worker.load.acquire(len(ids), max_new)
        gate_pass: Pass = NO_GATE
        seq: SimSequence | None = None
        success = False
        hold_key = 0
        try:
            if self.gate is not None:
                entered = loop.time()
                gate_pass = await self.gate.enter(worker.id, worker.sim.max_running_requests, uncached)
                out.gate_s = loop.time() - entered
            sent = loop.time()
            if self.holds is not None:  # as dispatch.open_on: after the gate, before the send
                packed = self.policy.packed(route)
                selection: Any = _Selection(worker, decision, packed if packed is not None else b"")
                hold = self.holds.check(selection, self.holds_config)
                if hold is not None:
                    await self.holds.wait(hold, "replay", "regular")
                    out.gate_s = (out.gate_s or 0.0) + loop.time() - sent
                    sent = loop.time()
                hold_key = self.holds.dispatched(selection)
            sink = Sink()
            seq = SimSequence(
                rid, 0, ids, TokenSource(self.vocab, prompt_digest(ids, 0), 0, 0.0), sink,
                max_new=max_new, ignore_eos=True,
            )  # fmt: skip
            worker.scheduler.submit(seq)
            final = False
            while not final:
                await sink.wait()
                for _, _, _, last in sink.take():
                    if out.ttft_s is None:
                        out.ttft_s = loop.time() - out.start_s
                        gate_pass.prefilled()
                        if self.holds is not None:
                            self.holds.prefilled(hold_key)
                            hold_key = 0
                        worker.progress.first_message(len(ids) - seq.cached_tokens, loop.time() - sent)
                        guard.first_token()
                    final = final or last
            out.ok = success = True
            out.latency_s = loop.time() - out.start_s
            out.prompt_tokens, out.cached_tokens = len(ids), seq.cached_tokens
        finally:
            if seq is not None and not seq.done:
                worker.scheduler.abort(seq)
            gate_pass.prefilled()
            if self.holds is not None:
                self.holds.prefilled(hold_key)
            gate_pass()
            guard.release()
            ticket.release()
            self.policy.on_finish(route, worker.id, seq.cached_tokens if seq is not None else 0, success)

    async def _poll_loads(self) -> None:
        """Every ``replay_load_poll_s``: each worker's own figures, as the load monitor polls them."""
        while True:
            now = self._now()
            for w in self.workers:
                w.poll(now)
            await asyncio.sleep(self.model.replay_load_poll_s)

    async def run(self, loads: dict[str, Any], jitter_seed: int = 0) -> dict[str, list[Outcome]]:
        """Each key's workload (tenant -> workload) from time 0; outcomes by tenant. Each
        request is delayed by its draw of ``replay_gateway_ms`` (``jitter_seed``)."""
        draw = random.Random(jitter_seed)
        most = self.model.replay_gateway_ms / 1000
        loop = asyncio.get_running_loop()
        runners = [asyncio.create_task(w.scheduler.run()) for w in self.workers]
        if self.model.replay_load_poll_s > 0:
            runners.append(asyncio.create_task(self._poll_loads()))
        results: dict[str, list[Outcome]] = {}
        tasks = []

        async def send(tenant: str, i: int, spec: Any, out: Outcome, delay: float) -> None:
            await asyncio.sleep(max(0.0, out.start_s + delay - loop.time()))
            assert spec.prompt_token_ids is not None
            await self.request(tenant, f"{tenant}-{i}", list(spec.prompt_token_ids), spec.max_tokens, out)

        for tenant, workload in loads.items():
            outs = results[tenant] = []
            for i, spec in enumerate(workload.requests):
                out = Outcome(start_s=spec.arrival_s or 0.0)
                outs.append(out)
                delay = draw.uniform(0.0, most) if most else 0.0
                tasks.append(asyncio.create_task(send(tenant, i, spec, out, delay)))
        cut = self.config.duration_s + self.config.grace_s
        _, pending = await asyncio.wait(tasks, timeout=cut)
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        for w in self.workers:
            w.scheduler.stop()
        for task in runners:
            task.cancel()
        await asyncio.gather(*runners, return_exceptions=True)
        close_policy(self.policy)
        return results


def fleet_sim(config: FairnessConfig, fleet: str) -> SimConfig:
    """The simulated worker build ``bench fairness`` starts for ``fleet``."""
    shape = FLEETS[fleet]
    return SimConfig(
        page_size=shape.page_size, kv_capacity_tokens=shape.kv_capacity_tokens, max_running_requests=config.max_running,
        step_base_s=shape.step_base_s, prefill_token_s=shape.prefill_token_s, decode_seq_s=shape.decode_seq_s,
        time_scale=config.time_scale_sim, seed=0,
    )  # fmt: skip


def replay_cell(
    config: FairnessConfig, fleet: str, queue: str, vocab: Any, sim_vocab: SimVocab, seed: int = 1,
    model: ReplayModel | None = None,
) -> Cell:
    """The bench's three runs of one (fleet, queue, seed) cell, each on its own virtual clock."""
    sim = fleet_sim(config, fleet)
    timeout = config.duration_s + config.grace_s
    light = tenant_workload(config, vocab, config.light_rate, seed=seed)
    heavy = tenant_workload(config, vocab, config.light_rate * config.heavy_factor, seed=seed + 1)
    cell = Cell(fleet, queue, seed)
    totals = [0, 0]

    def one_run(loads: dict[str, Any], weights: list[str], run: str) -> dict[str, list[Outcome]]:
        replay = Replay(config, sim, admission_config(queue, timeout, weights), sim_vocab, model)
        results = run_virtual(replay.run(loads, jitter_seed=seed))
        append_rows(config.requests_out, request_rows(cell, run, results, [w.id for w in replay.workers]))
        for outs in results.values():
            for o in outs:
                if o.ok:
                    totals[0] += o.prompt_tokens
                    totals[1] += o.cached_tokens
        return results

    alone = one_run({"light": light}, [], "alone")
    cell.alone_p50, cell.alone_p99 = ttft_percentile(alone["light"], 50), ttft_percentile(alone["light"], 99)
    together = one_run({"light": light, "heavy": heavy}, [], "together")
    cell.light_p50, cell.light_p99 = ttft_percentile(together["light"], 50), ttft_percentile(together["light"], 99)
    cell.light_ok = f"{sum(o.ok for o in together['light'])}/{len(light.requests)}"
    lo, hi = config.duration_s / 3, config.duration_s

    def done_per_s(outs: Sequence[Outcome]) -> float:
        return sum(1 for o in outs if o.ok and lo <= o.start_s + (o.latency_s or 0.0) < hi) / (hi - lo)

    cell.heavy_done_per_s = done_per_s(together["heavy"])
    cell.all_done_per_s = cell.heavy_done_per_s + done_per_s(together["light"])
    if config.shares:
        wa, wb = config.share_weights
        share_a = tenant_workload(config, vocab, config.share_rate, seed=seed + 2)
        share_b = tenant_workload(config, vocab, config.share_rate, seed=seed + 3)
        both = one_run({"a": share_a, "b": share_b}, [f"a={wa:g}", f"b={wb:g}"], "shares")
        cell.share = shares(both, {"a": wa, "b": wb}, lo, hi)
    cell.hit_rate = totals[1] / totals[0] if totals[0] else None
    return cell


def replay_all(
    config: FairnessConfig, console: Any, tokenizer_dir: str, model: ReplayModel | None = None,
) -> list[Cell]:
    """Every (fleet, queue) cell of ``config``, printed as each ends."""
    import time

    from gateway_lab.bench.workloads import Vocab
    from gateway_lab.sim.vocab import load_vocab

    vocab = Vocab.from_tokenizer_dir(tokenizer_dir)
    sim_vocab = load_vocab(tokenizer_dir)
    cells = []
    for fleet in config.fleets:
        for seed in config.seeds:
            for queue in config.queues:
                start = time.process_time()
                cell = replay_cell(config, fleet, queue, vocab, sim_vocab, seed, model)
                cells.append(cell)
                console.print(" | ".join(row(cell)) + f"  ({time.process_time() - start:.1f} s CPU)")
    return cells



def run(args: argparse.Namespace) -> int:
    from gateway_lab.bench import results
    from gateway_lab.bench.workloads import default_tokenizer_dir

    config = config_of(args)
    console = results.console(200)
    try:
        model = from_namespace(ReplayModel, args)
    except ValueError as exc:
        raise SystemExit(f"bad arguments: {exc}") from exc
    fresh_requests_out(config)
    cells = replay_all(config, console, str(default_tokenizer_dir()), model)
    return report(config, console, cells, "fairness replay (virtual clock)")
