"""Start what a benchmark measures, one way for every scenario: a fleet of workers of a
given kind, our gateway or a peer (SMG) in front of it, and stop both however the run ends.

Fleets (``fleet(kind, n, ...)``):

* ``sim``: simulated workers in this process (``SimFleet``): their caches, counters and
  fault knobs are at hand, and one can be killed and restarted on its port;
* ``process``: simulated workers in one child process (``SubprocessFleet``): their cost
  stays out of this process's CPU, their counters arrive when they stop;
* ``processes``: one child process per simulated worker (``WorkerProcesses``), so one
  can be SIGKILLed alone and restarted on its port;
* ``zero``: zero-cost workers with no step loop (``ZeroFleet``), for gateway CPU figures;
* ``canned``: nginx answering canned gRPC replies (``CannedFleet``), cheaper still;
* ``http``: simulated workers speaking SGLang's or vLLM's HTTP API in this process
  (``HttpFleet``).

Gateways (``gateway(kind, urls, policy, ...)``): ``ours`` is ``token-gateway serve`` in a
child process (``ServeProcess``; ``argv`` replaces its command line, ``env`` its
environment, e.g. another checkout's ``PYTHONPATH``), ``smg`` the peer from
``scripts/peers.sh`` (``PeerProcess``). ``ours_config`` builds our settings for a policy
variant, for ``bench.inprocess.serve_in_process`` (scenarios that read the gateway's state).
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import dataclasses
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, overload

from gateway_lab.sim.config import SimConfig

if TYPE_CHECKING:
    from gateway.server.config import GatewayConfig
    from gateway_lab.bench.canned_fleet import CannedFleet
    from gateway_lab.bench.peers import PeerProcess
    from gateway_lab.bench.serve_process import ServeProcess
    from gateway_lab.bench.zero_fleet import ZeroFleet
    from gateway_lab.sim.fleet import SimFleet, SubprocessFleet, WorkerProcesses
    from gateway_lab.sim.http_server import SimHttpWorker

FLEETS = ("sim", "process", "processes", "zero", "canned", "http")
PEERS = ("smg",)  # peers.PEER_MODULES: what scripts/peers.sh installs
GATEWAYS = ("ours", *PEERS)
PEERS_PYTHON = ".peers-venv/bin/python"  # scripts/peers.sh installs it in the checkout

# workers whose steps cost nothing: what a gateway adds is all there is to measure
ZERO_COST = SimConfig(step_base_s=0.0, prefill_token_s=0.0, decode_seq_s=0.0, time_scale=0.0)


@overload
def fleet(kind: Literal["sim"], n: int, sim: SimConfig | None = ..., **options: Any) -> contextlib.AbstractAsyncContextManager[SimFleet]: ...
@overload
def fleet(kind: Literal["process"], n: int, sim: SimConfig | None = ..., **options: Any) -> contextlib.AbstractAsyncContextManager[SubprocessFleet]: ...
@overload
def fleet(kind: Literal["processes"], n: int, sim: SimConfig | None = ..., **options: Any) -> contextlib.AbstractAsyncContextManager[WorkerProcesses]: ...
@overload
def fleet(kind: Literal["canned"], n: int, sim: SimConfig | None = ..., **options: Any) -> contextlib.AbstractAsyncContextManager[CannedFleet]: ...
@overload
def fleet(kind: Literal["zero"], n: int, sim: SimConfig | None = ..., **options: Any) -> contextlib.AbstractAsyncContextManager[ZeroFleet]: ...
@overload
def fleet(kind: Literal["http"], n: int, sim: SimConfig | None = ..., **options: Any) -> contextlib.AbstractAsyncContextManager[HttpFleet]: ...
def fleet(kind: str, n: int, sim: SimConfig | None = None, **options: Any) -> contextlib.AbstractAsyncContextManager[Any]:  # fmt: skip
    """``n`` workers of ``kind``, stopped on exit. ``options`` go to the fleet's class:
    ``roles``, ``engine`` or ``tls`` (sim); ``roles``, ``extra_args`` or ``ready_timeout``
    (process); ``faults`` (worker index -> ``SimConfig`` fields only that worker gets),
    ``extra_args`` or ``ready_timeout`` (processes); ``tokenizer_dir``, ``step_s`` or
    ``processes`` (zero); ``output_tokens`` or ``max_running_requests`` (canned, which
    takes no ``sim``); ``api`` (http)."""
    if kind not in FLEETS:
        raise ValueError(f"unknown fleet kind {kind!r}; known: {', '.join(FLEETS)}")
    if n < 1:
        raise ValueError(f"a fleet needs at least one worker, not {n}")
    return _fleet(kind, n, sim, options)


@contextlib.asynccontextmanager
async def _fleet(kind: str, n: int, sim: SimConfig | None, options: dict[str, Any]) -> AsyncIterator[Any]:
    if kind == "sim":
        from gateway_lab.sim.fleet import SimFleet

        async with SimFleet.start(n, sim, **options) as in_process:
            yield in_process
    elif kind == "process":
        from gateway_lab.sim.fleet import SubprocessFleet

        child = SubprocessFleet(n, sim, **options)
        atexit.register(child.kill)  # in case this process dies before the finally below
        try:
            async with child:
                yield child
        finally:
            child.kill()  # also when the start itself was cancelled
            atexit.unregister(child.kill)
    elif kind == "processes":
        from gateway_lab.sim.fleet import WorkerProcesses

        base = sim or SimConfig()
        faults: dict[int, dict[str, Any]] = options.pop("faults", None) or {}
        if not set(faults) <= set(range(n)):
            raise ValueError(f"faults for workers {sorted(set(faults) - set(range(n)))}, of {n}")
        configs = [dataclasses.replace(base, **faults.get(i, {})) for i in range(n)]
        children = WorkerProcesses(configs, **options)
        atexit.register(children.kill_all)  # in case this process dies before the finally below
        try:
            async with children:
                yield children
        finally:
            children.kill_all()
            atexit.unregister(children.kill_all)
    elif kind == "canned":
        from gateway_lab.bench.canned_fleet import CannedFleet

        if sim is not None:
            raise ValueError("a canned fleet has no simulator settings; give output_tokens or max_running_requests")
        canned = CannedFleet(n, **options)
        await asyncio.to_thread(canned.start)
        try:
            yield canned
        finally:
            await asyncio.to_thread(canned.stop)
    elif kind == "http":
        from gateway_lab.sim.http_server import http_fleet

        async with http_fleet(n, sim, **options) as workers:
            yield HttpFleet(workers)
    else:
        from gateway_lab.bench.workloads import default_tokenizer_dir
        from gateway_lab.bench.zero_fleet import ZeroFleet

        tokenizer_dir = Path(options.pop("tokenizer_dir", None) or default_tokenizer_dir())
        async with ZeroFleet(n, tokenizer_dir, **options) as zero:
            yield zero


@dataclass(frozen=True, slots=True)
class HttpFleet:
    """Simulated HTTP workers in this process."""

    workers: list[SimHttpWorker]

    @property
    def urls(self) -> list[str]:
        return [w.url for w in self.workers]

    def stats(self) -> list[dict[str, Any]]:
        """Each worker's counters, as ``SimFleet.stats`` gives them."""
        return [w.stats() for w in self.workers]


@dataclass(frozen=True, slots=True)
class Gateway:
    """A gateway under test: where to send requests, and its process for CPU and RSS."""

    kind: str
    url: str
    pid: int
    log_path: Path
    ready_info: dict[str, Any] = dataclasses.field(default_factory=dict)


@contextlib.asynccontextmanager
async def gateway(
    kind: str,
    urls: Sequence[str],
    policy: str,
    *,
    extra_args: Sequence[str] = (),
    argv: Sequence[str] = (),
    name: str = "",
    env: dict[str, str] | None = None,
    log_dir: str | Path | None = None,
    ready_timeout_s: float = 60.0,
    stop_timeout_s: float = 5.0,
    peers_python: str = PEERS_PYTHON,
    tokenizer_dir: str = "",
    keep_log: bool = False,
) -> AsyncIterator[Gateway]:
    """Gateway ``kind`` routing with ``policy`` over ``urls``; stopped on exit (SIGTERM, then
    SIGKILL after ``stop_timeout_s``), its log removed after a clean run unless ``keep_log``.
    A gateway that fails to start, or exits by itself before the block ends, raises with
    its log's tail (the run is invalid: the benchmark exits non-zero)."""
    process: ServeProcess | PeerProcess
    if kind == "ours":
        from gateway_lab.bench.serve_process import ServeProcess

        options: dict[str, Any] = {"ready_timeout_s": ready_timeout_s, "log_dir": log_dir, "env": env}
        if argv:
            process = await ServeProcess.launch(argv, name or f"gateway-{policy}", **options)
        else:
            process = await ServeProcess.start(urls, policy, extra_args=extra_args, **options)
        info = process.ready_info
    elif kind in PEERS:
        from gateway_lab.bench.peers import PeerProcess
        from gateway_lab.bench.workloads import default_tokenizer_dir

        tokenizer = tokenizer_dir or str(default_tokenizer_dir())
        process = await PeerProcess.start(peers_python, kind, urls, policy, tokenizer, ready_timeout_s=ready_timeout_s)
        info = {}
    else:
        raise ValueError(f"unknown gateway {kind!r}; known: {', '.join(GATEWAYS)}")
    clean = False
    try:
        yield Gateway(kind, process.url, process.process.pid, process.log_path, info)
        clean = True
    finally:
        died = process.process.returncode  # before our stop: it exited on its own during the run
        await process.stop(stop_timeout_s)
        if clean and died is None and not keep_log:  # a failed run keeps its log for the post-mortem
            process.remove_log()
    if died is not None:  # the figures measured a dying gateway: never a valid run
        from gateway_lab.bench.serve_process import _log_tail

        raise RuntimeError(f"{kind} gateway exited during the run (code {died}); log {process.log_path}:\n"
                           f"{_log_tail(process.log_path)}")  # fmt: skip


# ---------------------------------------------------------------------------- policy variants


def parse_variant(policy: str) -> tuple[str, dict[str, Any]]:
    """``NAME[:knob=value,...]`` -> (NAME, typed overrides), for ablation cells: knobs of
    ``PolicyConfig``, the prefill gate's (``prefill_gate*``, ``DispatchConfig``),
    ``reply_token_reuse``, ``worker_dp_size`` and ``kv_events`` (``ServerConfig``), ``encoder_at_load``
    (``EngineConfig``), the worker gate's ``fleet_headroom``, ``fair_reserve``,
    ``prefill_budget_tokens``, ``gate_share_first``, ``fair_spill``, ``fair_prefill_reserve`` and ``fair_warm_reroute``, ``queue_timeout_s`` (``AdmissionConfig``)."""
    from gateway.pipeline.dispatch import DispatchConfig
    from gateway.pipeline.engine import EngineConfig
    from gateway.policies.factory import PolicyConfig
    from gateway.server.admission import AdmissionConfig
    from gateway.server.config import ServerConfig

    name, _, rest = policy.partition(":")
    knobs: dict[str, Any] = {}
    if not rest:
        return name, knobs
    fields: dict[str, type] = {f.name: PolicyConfig for f in dataclasses.fields(PolicyConfig)}
    fields |= {f.name: DispatchConfig for f in dataclasses.fields(DispatchConfig) if f.name.startswith("prefill_gate")}
    fields["reply_token_reuse"] = fields["worker_dp_size"] = fields["kv_events"] = ServerConfig
    fields["encoder_at_load"] = EngineConfig
    fields |= dict.fromkeys(ADMISSION_KNOBS, AdmissionConfig)
    for item in rest.split(","):
        key, sep, raw = item.partition("=")
        key = key.strip().replace("-", "_")
        if not sep or key not in fields or key in ("policy", "seed"):
            raise ValueError(f"{item!r} in {policy!r} is not knob=value of a policy or prefill-gate setting")
        default = getattr(fields[key](), key)
        if isinstance(default, bool):
            if raw.lower() not in ("true", "false", "1", "0", "on", "off"):
                raise ValueError(f"{key} takes true/false, not {raw!r}")
            knobs[key] = raw.lower() in ("true", "1", "on")
        elif isinstance(default, int):
            knobs[key] = int(raw)
        elif isinstance(default, float):
            knobs[key] = float(raw)
        else:
            knobs[key] = raw
    return name, knobs


ADMISSION_KNOBS = ("fleet_headroom", "fair_reserve", "prefill_budget_tokens", "gate_share_first", "fair_spill",
                   "fair_prefill_reserve", "fair_warm_reroute", "queue_timeout_s")
"""The ``AdmissionConfig`` knobs a variant may set (the worker gate, its prefill pacing and order, and the
queue timeout a whole burst behind the fleet cap needs)."""


def split_knobs(knobs: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(PolicyConfig knobs, DispatchConfig knobs) of a parsed variant (admission knobs in neither)."""
    gate = {k: v for k, v in knobs.items() if k.startswith("prefill_gate")}
    return {k: v for k, v in knobs.items() if k not in gate and k not in ADMISSION_KNOBS}, gate


def knob_flags(knobs: dict[str, Any]) -> list[str]:
    """A parsed variant's knobs as ``serve`` flags (for the gateway in its own process)."""
    out: list[str] = []
    for key, value in knobs.items():
        flag = "--" + key.replace("_", "-")
        if isinstance(value, bool):
            out.append(flag if value else "--no-" + key.replace("_", "-"))
        else:
            out += [flag, str(value)]
    return out


def ours_config(
    urls: Sequence[str], variant: str, tokenizer_dir: str, scratch: str, *, seed: int | None = None,
    own_policy: bool = True,
) -> GatewayConfig:
    """Our gateway's settings for ``NAME[:knob=value,...]`` (``parse_variant``) over ``urls``.

    ``own_policy=False`` leaves the policy settings at their defaults, for a policy the
    caller makes itself (the oracle); the gate and reply knobs still apply."""
    from gateway.server.config import GatewayConfig, ServerConfig

    config = GatewayConfig(
        server=ServerConfig(
            worker_urls=list(urls), tokenizer_path=tokenizer_dir, tokenizer_cache_dir=scratch, log_level="warning"
        )
    )
    name, knobs = parse_variant(variant)
    config.server.reply_token_reuse = knobs.pop("reply_token_reuse", True)
    config.server.worker_dp_size = knobs.pop("worker_dp_size", 0)  # 1: DP ranks hidden, the engine balances them
    config.server.kv_events = knobs.pop("kv_events", False)  # the tree fed by the workers' KV events (SMG's default)
    config.engine.encoder_at_load = knobs.pop("encoder_at_load", True)
    admission = {k: knobs[k] for k in ADMISSION_KNOBS if k in knobs}
    config.admission = dataclasses.replace(config.admission, **admission)
    knobs, gate = split_knobs(knobs)
    config.dispatch = dataclasses.replace(config.dispatch, **gate)
    if seed is not None:
        knobs["seed"] = seed
    if own_policy:
        config.policy = dataclasses.replace(config.policy, policy=name, **knobs)
    return config

