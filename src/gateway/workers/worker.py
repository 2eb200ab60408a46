"""One registered worker: its client, what it told us about itself, and its state."""

from __future__ import annotations

import json
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import ClassVar

from google.protobuf.json_format import MessageToDict

from gateway.policies.base import LoadSnapshot, WorkerView, build_worker_view
from gateway.proto import sglang_scheduler_pb2 as pb
from gateway.workers.breaker import BreakerState, CircuitBreaker
from gateway.workers.load import WorkerLoad
from gateway.workers.transport import WorkerTransport
from gateway.workers.watchdog import ProgressTracker

ROLES = ("regular", "prefill", "decode")
LOADS_VIEW_REUSE_S = 0.01  # a policy's load view is at most this much older than its age says


PAGE_SIZE_UNKNOWN = "unknown (assumed 1)"
RANK_SEPARATOR = "@"
"""Between an engine's id and a data-parallel rank in a rank's worker id (``host:port@2``, SMG's form)."""


def rank_id(engine_id: str, dp_rank: int | None) -> str:
    """The routing id of one data-parallel rank of an engine (the engine's own id without one)."""
    return engine_id if dp_rank is None else f"{engine_id}{RANK_SEPARATOR}{dp_rank}"


def engine_of(worker_id: str) -> str:
    """The engine a worker id belongs to: the id without its ``@rank`` suffix."""
    base, sep, rank = worker_id.rpartition(RANK_SEPARATOR)
    return base if sep and rank.isdigit() else worker_id


def one_per_engine(workers: list[Worker]) -> list[Worker]:
    """The first worker of each engine in ``workers``, in order: for the calls that answer
    for the whole engine (loads, flush, health, server info), made once, not once per rank."""
    seen: set[int] = set()
    out: list[Worker] = []
    for w in workers:
        if id(w.client) not in seen:
            seen.add(id(w.client))
            out.append(w)
    return out

GATEWAY_INSTANCE_ARG = "token_gateway_instance"
"""The server argument a gateway's SGLang pass-through adds to GetServerInfo: its process's
instance id, so a gateway asked to register itself as a worker can tell (and refuse)."""


@dataclass
class WorkerInfo:
    """The worker's self-description from GetModelInfo and GetServerInfo, as reported.

    Not every field is true on a real ``--grpc-mode`` worker (see docs/sglang-mapping.md):
    ``kv_pool_tokens`` is GetModelInfo's ``max_context_length``, which is the KV pool
    size, not the model's context; ``reported_vocab_size`` and ``reported_eos_token_ids``
    are placeholders the servicer fills with fixed values, kept only to be shown. The
    model's real limits and defaults are settled by ``pipeline.model_facts`` from the
    model's files and the server arguments kept here.
    """

    model: str
    model_path: str = ""
    tokenizer_path: str = ""
    kv_pool_tokens: int = 0  # GetModelInfo max_context_length: the KV pool size
    reported_vocab_size: int = 0  # a placeholder on real workers: never used
    reported_eos_token_ids: tuple[int, ...] = ()  # a placeholder on real workers: never used
    bos_token_id: int | None = None
    is_generation: bool = True
    model_type: str = ""
    page_size: int = 1
    page_size_source: str = PAGE_SIZE_UNKNOWN
    kv_capacity_tokens: int = 0
    disaggregation_mode: str = "null"
    bootstrap_port: int | None = None
    dp_size: int = 1  # data-parallel ranks behind this one address: one routing target each
    max_running_requests: int = 0  # server_args max_running_requests (0: not reported)
    max_req_input_len: int = 0  # the scheduler's prompt limit (prompts this long or longer are refused)
    context_length_arg: int | None = None  # server_args.context_length: the operator's override
    sampling_defaults_mode: str = ""  # server_args.sampling_defaults ("model" or "openai"; "": not reported)
    default_sampling_json: str = ""  # GetModelInfo default_sampling_params_json, as sent
    gateway_instance: str = ""  # set when the "worker" is a token-gateway's pass-through (GATEWAY_INSTANCE_ARG)
    start_time: float = 0.0  # GetServerInfo start_time, seconds (0: not reported): a restart changes it
    kv_events_config: str = ""  # server_args.kv_events_config as JSON text ("": not reported; workers.kv_event_discovery)
    matches_stop_strings: bool = False
    """The worker has its own tokenizer (``skip_tokenizer_init`` reported false), so it can
    take stop strings; not reported means it cannot."""
    version: ClassVar[int] = 0
    """Writes to this info so far (an instance's own count shadows this start): it is changed
    in place (a page size learned from KV events, a restart's start time), and a worker's
    view is reused while this count and the worker's own (``Worker.version``) stand."""

    def __setattr__(self, name: str, value: object) -> None:
        object.__setattr__(self, name, value)
        object.__setattr__(self, "version", self.version + 1)
        Roster.writes += 1

    @classmethod
    def from_replies(
        cls, model_info: pb.GetModelInfoResponse, server_info: pb.GetServerInfoResponse
    ) -> WorkerInfo:
        args = MessageToDict(server_info.server_args) if server_info.HasField("server_args") else {}
        sched = MessageToDict(server_info.scheduler_info) if server_info.HasField("scheduler_info") else {}
        model = (
            model_info.served_model_name
            or args.get("served_model_name")
            or model_info.model_path
            or "default"
        )
        bootstrap = args.get("disaggregation_bootstrap_port")
        page, page_source = _page_size(args, sched)
        context_arg = _positive_int(args.get("context_length"))
        return cls(
            model=str(model),
            model_path=model_info.model_path,
            tokenizer_path=model_info.tokenizer_path,
            kv_pool_tokens=model_info.max_context_length,
            reported_vocab_size=model_info.vocab_size,
            reported_eos_token_ids=tuple(model_info.eos_token_ids),
            bos_token_id=model_info.bos_token_id if model_info.bos_token_id > 0 else None,
            is_generation=model_info.is_generation,
            model_type=model_info.model_type,
            page_size=page,
            page_size_source=page_source,
            kv_capacity_tokens=int(server_info.max_total_num_tokens or args.get("max_total_num_tokens") or 0),
            disaggregation_mode=str(args.get("disaggregation_mode") or "null"),
            bootstrap_port=int(bootstrap) if bootstrap else None,
            dp_size=max(1, int(args.get("dp_size") or 1)),
            max_running_requests=max(0, int(args.get("max_running_requests") or 0)),
            max_req_input_len=max(0, model_info.max_req_input_len),
            context_length_arg=context_arg,
            sampling_defaults_mode=str(args.get("sampling_defaults") or ""),
            default_sampling_json=model_info.default_sampling_params_json,
            gateway_instance=str(args.get(GATEWAY_INSTANCE_ARG) or ""),
            start_time=start_time_of(server_info),
            kv_events_config=json_text(args.get("kv_events_config")),
            matches_stop_strings=args.get("skip_tokenizer_init") is False,
        )

    def learn_page_size(self, block_size: int) -> bool:
        """A KV event's block size, when the worker reported no page size: True if it changed."""
        if block_size < 1 or self.page_size_source not in (PAGE_SIZE_UNKNOWN, "kv_events"):
            return False
        changed = self.page_size != block_size or self.page_size_source != "kv_events"
        self.page_size, self.page_size_source = block_size, "kv_events"
        return changed


def _positive_int(value: object) -> int | None:
    """A server argument that is a real positive number (SGLang leaves unset ones null)."""
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        return None
    return int(value)


def json_text(value: object) -> str:
    """A server argument that is JSON, as text: SGLang reports its config as the text it took,
    the vLLM HTTP client copies an object out of vLLM's configuration."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict):
        return json.dumps(value)
    return ""


def _page_size(args: dict[str, object], sched: dict[str, object]) -> tuple[int, str]:
    """The worker's page size and where it came from. SGLang's ``page_size`` argument is
    null unless the operator set it (the server resolves it later, to 64 on some attention
    backends), so a null one is not 1: it is unknown until the KV events tell."""
    arg = _positive_int(args.get("page_size"))
    if arg is not None:
        return arg, "server_args.page_size"
    reported = _positive_int(sched.get("page_size"))
    if reported is not None:
        return reported, "scheduler_info.page_size"
    return 1, PAGE_SIZE_UNKNOWN


def start_time_of(server_info: pb.GetServerInfoResponse) -> float:
    """When the worker process started, from GetServerInfo (0.0 when it does not say)."""
    if not server_info.HasField("start_time"):
        return 0.0
    return server_info.start_time.seconds + server_info.start_time.nanos / 1e9


class Roster:
    """How many writes there were to what decides a pool's members and their cache
    parameters: a worker's id, role, info, client or draining flag, an info's fields,
    a registry's members. A memo of a pool (``pipeline.router``) is current while the
    count stands; counted for every worker of every registry (a memo is only ever
    rebuilt once too often)."""

    writes: ClassVar[int] = 0


class Worker:
    """A worker as the gateway tracks it: one routing target. Mutated only on the event loop.

    An engine with several data-parallel ranks (SGLang ``--dp-size N``) is N of these, one
    per rank (``dp_rank``, id ``host:port@rank``): each rank has its own KV cache, so its
    own share of the policy's tree, its own load, breaker and watchdog record. The ranks
    share the engine's client (one connection) and its ``info``; the calls that answer for
    the whole engine (health, loads, flush) are made once per engine (``one_per_engine``).
    """

    # Every write to one of these counts in ``version`` (``__setattr__``): the view's inputs
    # that change rarely, if ever, so a view's stamp reads one number for them all (``views_of``).
    # The figures that change with every request (loads, the breaker's verdict, which also
    # changes with time alone) are read into the stamp directly: counting their writes would
    # cost each a call.
    # A write to one of ``ROSTER_INPUTS`` also counts in ``Roster.writes``.
    VIEW_INPUTS: ClassVar[frozenset[str]] = frozenset({
        "id", "url", "role", "bootstrap_port", "info", "sibling_queued_prompt_tokens", "peer_queued_prompt_tokens",
        "healthy", "draining",
    })  # fmt: skip
    ROSTER_INPUTS: ClassVar[frozenset[str]] = frozenset({"id", "role", "info", "draining", "client"})

    def __setattr__(self, name: str, value: object) -> None:
        object.__setattr__(self, name, value)
        if name in Worker.VIEW_INPUTS:
            object.__setattr__(self, "version", self.version + 1)
        if name in Worker.ROSTER_INPUTS:
            Roster.writes += 1

    def __init__(
        self,
        url: str,
        client: WorkerTransport,
        info: WorkerInfo,
        *,
        role: str = "regular",
        bootstrap_port: int | None = None,
        breaker: CircuitBreaker | None = None,
        progress: ProgressTracker | None = None,
        dp_rank: int | None = None,
    ) -> None:
        if role not in ROLES:
            raise ValueError(f"unknown worker role {role!r}; expected one of {ROLES}")
        if dp_rank is not None and not 0 <= dp_rank < info.dp_size:
            raise ValueError(f"dp_rank {dp_rank} not in [0, {info.dp_size})")
        self.version = 0  # writes to ``VIEW_INPUTS`` so far
        self.client = client
        self.url = client.url
        self.engine_id = client.address.target
        self.dp_rank = dp_rank
        self.id = rank_id(self.engine_id, dp_rank)
        self.info = info
        self.role = role
        self.bootstrap_port = bootstrap_port if bootstrap_port is not None else info.bootstrap_port
        self.load = WorkerLoad()
        # Other gateway processes' outstanding work here, summed (set by gateway.sync; its
        # queued_prefill_tokens is their uncached part). Policies see local + remote,
        # draining waits for the local part only.
        self.remote_load = WorkerLoad()
        # Whole prompt tokens the same-host siblings of ``serve --processes N`` have sent here
        # with no first token yet (set by gateway.sync.host_prefill, fresh at every choice):
        # what the worker's polled waiting figure counts of their traffic.
        self.sibling_queued_prompt_tokens = 0
        # The same for other replicas (set by gateway.sync.apply from the bus, as late as the bus;
        # same-host siblings that share memory are left to the figure above).
        self.peer_queued_prompt_tokens = 0
        # Requests on this worker (sent, not ended) of the same-host siblings (gateway.sync.host_prefill,
        # fresh at every choice) and of the other replicas (gateway.sync.apply, as late as the bus):
        # the prefill gate's free-slot check. ``remote_load.in_flight`` counts requests a process
        # holds in its prefill gate too, which are not on the worker yet.
        self.sibling_in_flight = 0
        self.peer_in_flight = 0
        # Where this target's KV events come from, once subscribed (workers.kv_events): a
        # data-parallel rank has none unless its engine's per-rank publishers are read.
        self.kv_events_source = ""
        # Why the KV-event publisher this target's engine reports is not read ("" when none):
        # shown rather than failing the join (workers.kv_events, --kv-events-zmq auto).
        self.kv_events_problem = ""
        self.breaker = breaker or CircuitBreaker()
        self.progress = progress or ProgressTracker()  # what the progress watchdog judges
        self.healthy = True
        self.draining = False
        self.polled: LoadSnapshot | None = None
        self.polled_at = 0.0
        self._view: tuple[tuple[object, ...], WorkerView, LoadSnapshot | None] | None = None  # (stamp, view, poll): ``views_of``
        # Health evidence (see workers/health.py): consecutive probe outcomes, the last
        # time a request or probe succeeded, and whether a failure asks for an early probe.
        self.failures = 0
        self.successes = 0
        self.last_ok_at = time.monotonic()
        self.last_probe_at = 0.0
        self.suspect = False

    @property
    def model(self) -> str:
        return self.info.model

    @property
    def available(self) -> bool:
        return self.healthy and not self.draining and self.breaker.allows()

    def record_outcome(self, success: bool | None) -> None:
        """An ordinary request's outcome: feeds the breaker and counts as health evidence.
        ``None`` (a client fault or a client cancel) says nothing about the worker."""
        if success is None:
            self.breaker.release_trial()
            return
        if success:
            self.breaker.record_success()
            self.last_ok_at = time.monotonic()
        else:
            self.breaker.record_failure()
            self.suspect = True

    def pin(self, request: pb.GenerateRequest | pb.EmbedRequest) -> None:
        """Name this rank in ``request`` (``data_parallel_rank``), so the engine runs it where
        the policy predicted its prefix is cached; clear a rank another target set (a retry)."""
        if self.dp_rank is not None:
            request.data_parallel_rank = self.dp_rank
        elif isinstance(request, pb.GenerateRequest):
            request.ClearField("data_parallel_rank")
        else:
            request.data_parallel_rank = 0

    def load_figures(self) -> tuple[int, int]:
        """(requests in flight that stream to the gateway, prompt tokens with no first message
        yet), for the watchdog: an answer asked for unstreamed is silent by design until it
        is done and has a deadline of its own (``dispatch.open_on``)."""
        return self.load.in_flight - self.load.silent, self.load.queued_prefill_tokens

    def trip(self, reason: str) -> None:
        """Out of rotation now (the watchdog saw it stop); half-open trials bring it back."""
        self.breaker.trip(reason)
        self.suspect = True

    def loads_view(self) -> LoadSnapshot | None:
        """The last polled load with its age, as the view has it (one copy per poll and
        clock tick of ``LOADS_VIEW_REUSE_S``: a policy reads it for every worker on every request)."""
        return self.view().loads

    def view(self) -> WorkerView:
        """What a policy may know of this worker now (``views_of``, which owns the reuse)."""
        return views_of((self,))[0]

    def _build_view(self, stamp: tuple[object, ...], ok: bool, polled: LoadSnapshot | None, now: float) -> WorkerView:
        """A fresh view, kept with the stamp of what it was built from and the poll it ages.
        The last view's loads copy is kept while it is of the same poll and tick (most
        rebuilds are for a load figure that moved)."""
        load, remote, info = self.load, self.remote_load, self.info
        loads = None
        if polled is not None:
            last = self._view
            if last is not None and last[2] is polled and last[0][3] == stamp[3]:
                loads = last[1].loads
            else:
                loads = polled.aged(max(0.0, now - self.polled_at))
        view = build_worker_view(  # every WorkerView field, in its order
            self.id,  # worker_id
            self.url,  # url
            self.role,  # role
            self.healthy and not self.draining and ok,  # available
            load.in_flight + remote.in_flight,  # in_flight
            load.queued_prefill_tokens,  # queued_prefill_tokens
            load.running_decode_tokens + remote.running_decode_tokens,  # running_decode_tokens
            remote.queued_prefill_tokens,  # remote_prefill_tokens: already the uncached part
            loads,  # loads
            info.kv_capacity_tokens,  # kv_capacity_tokens
            info.page_size,  # page_size
            info.max_running_requests,  # max_running_requests
            self.bootstrap_port,  # bootstrap_port
            self.sibling_queued_prompt_tokens + self.peer_queued_prompt_tokens,  # remote_queued_prompt_tokens
        )
        object.__setattr__(self, "_view", (stamp, view, polled))  # not an input: past ``__setattr__``'s count
        return view

    def describe(self) -> dict[str, object]:
        """The admin API's view of this worker."""
        return {
            "id": self.id,
            "url": self.url,
            "engine_id": self.engine_id,
            "dp_rank": self.dp_rank,
            "dp_size": self.info.dp_size,
            "kind": self.client.kind,
            # Token ids: routing sees what the worker caches. Without (an OpenAI backend): text, load only.
            "token_ids": "token_ids" not in self.client.lacks,
            "routing": "tokens" if "token_ids" not in self.client.lacks else "load only (text)",
            "lacks": self._lacks(),
            "kv_events_source": self.kv_events_source or None,
            "kv_events_problem": self.kv_events_problem or None,
            "is_generation": self.info.is_generation,
            "role": self.role,
            "model": self.model,
            "healthy": self.healthy,
            "draining": self.draining,
            "available": self.available,
            "breaker": self.breaker.state.value,
            "breaker_detail": self._breaker_detail(),
            "in_flight": self.load.in_flight,
            "queued_prefill_tokens": self.load.queued_prefill_tokens,
            "running_decode_tokens": self.load.running_decode_tokens,
            "total_requests": self.load.total_requests,
            "page_size": self.info.page_size,
            "page_size_source": self.info.page_size_source,
            "kv_capacity_tokens": self.info.kv_capacity_tokens,
            "max_req_input_len": self.info.max_req_input_len,
            "reported": {  # as the worker sent them; placeholders on real workers, never used
                "max_context_length (the KV pool size)": self.info.kv_pool_tokens,
                "vocab_size": self.info.reported_vocab_size,
                "eos_token_ids": list(self.info.reported_eos_token_ids),
            },
            "bootstrap_port": self.bootstrap_port,
        }

    def _lacks(self) -> list[str]:
        """What the engine lacks, for this target: a rank's tree learns from routing only (an
        engine's KV-event stream is rank 0's), unless the engine's own per-rank publishers are
        read (vLLM, SGLang: ``--kv-events-zmq``), which also gives KV events to a transport without
        a stream of them (vLLM's and SGLang's HTTP servers)."""
        lacks = set(self.client.lacks)
        if self.dp_rank is not None:
            lacks.add("kv_events")
        if self.kv_events_source and self.kv_events_source != "SubscribeKvEvents":
            lacks.discard("kv_events")
        return sorted(lacks)

    def _breaker_detail(self) -> dict[str, object]:
        b = self.breaker
        total, failed = b.window_counts()
        return {
            "consecutive_failures": b.consecutive_failures,
            "window_requests": total,
            "window_failures": failed,
            "opens": b.opens,
            "last_open_reason": b.last_reason,
            "watchdog_stalls": self.progress.stalls,
            "learned_step_s": self.progress.step_s,
            "learned_prefill_tokens_per_s": self.progress.prefill_tps,
        }


def views_of(workers: Iterable[Worker]) -> list[WorkerView]:
    """What a policy may know of each of ``workers`` now, in their order.

    The router asks for every worker of a pool on every request, and between two requests
    most of them have not changed: a worker's last view is handed out again while its stamp
    and its poll are the same. The stamp is what the view is built from: the counts of
    writes to the worker's rare inputs and to its info (``Worker.version``,
    ``WorkerInfo.version``), the breaker's verdict (an open breaker half-opens by time
    alone), the clock's tick of ``LOADS_VIEW_REUSE_S`` when there is a poll (the loads copy
    ages by whole ticks, every worker's at once), and the figures that move with every
    request, read as they are (its own and the other processes' load: a remote load is also
    changed in place). The poll is compared by identity (the cached view holds it, so its
    id is not reused). One loop over the pool, no call for a worker that did not change."""
    closed = BreakerState.CLOSED
    now = time.monotonic()
    tick = now // LOADS_VIEW_REUSE_S
    out: list[WorkerView] = []
    for w in workers:
        polled, breaker = w.polled, w.breaker
        ok = breaker.state is closed or breaker.allows()
        load, remote = w.load, w.remote_load
        stamp = (
            w.version, w.info.version, ok, polled is None or tick,
            load.in_flight, load.queued_prefill_tokens, load.running_decode_tokens,
            remote.in_flight, remote.queued_prefill_tokens, remote.running_decode_tokens,
        )  # fmt: skip
        cached = w._view
        if cached is not None and cached[2] is polled and cached[0] == stamp:
            out.append(cached[1])
        else:
            out.append(w._build_view(stamp, ok, polled, now))
    return out
