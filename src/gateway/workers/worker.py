"""One registered worker: its client, what it told us about itself, and its state."""

from __future__ import annotations

import dataclasses
import json
import time
from dataclasses import dataclass, field

from google.protobuf.json_format import MessageToDict

from gateway.policies.base import LoadSnapshot, WorkerView
from gateway.proto import sglang_scheduler_pb2 as pb
from gateway.workers.breaker import CircuitBreaker
from gateway.workers.load import WorkerLoad
from gateway.workers.transport import WorkerTransport
from gateway.workers.watchdog import ProgressTracker

ROLES = ("regular", "prefill", "decode")
LOADS_VIEW_REUSE_S = 0.01  # a policy's load view is at most this much older than its age says


@dataclass
class WorkerInfo:
    """The worker's self-description from GetModelInfo and GetServerInfo."""

    model: str
    model_path: str = ""
    tokenizer_path: str = ""
    max_context_length: int = 0
    vocab_size: int = 0
    eos_token_ids: tuple[int, ...] = ()
    bos_token_id: int | None = None
    is_generation: bool = True
    model_type: str = ""
    page_size: int = 1
    kv_capacity_tokens: int = 0
    disaggregation_mode: str = "null"
    bootstrap_port: int | None = None
    dp_size: int = 1  # data-parallel ranks behind this one address (PD rooms align to them)
    max_running_requests: int = 0  # server_args max_running_requests (0: not reported)
    default_sampling: dict[str, float] = field(default_factory=dict)

    @classmethod
    def from_replies(
        cls, model_info: pb.GetModelInfoResponse, server_info: pb.GetServerInfoResponse
    ) -> WorkerInfo:
        args = MessageToDict(server_info.server_args) if server_info.HasField("server_args") else {}
        model = (
            model_info.served_model_name
            or args.get("served_model_name")
            or model_info.model_path
            or "default"
        )
        defaults: dict[str, float] = {}
        if model_info.default_sampling_params_json:
            try:
                defaults = dict(json.loads(model_info.default_sampling_params_json))
            except (ValueError, TypeError):
                defaults = {}
        bootstrap = args.get("disaggregation_bootstrap_port")
        return cls(
            model=str(model),
            model_path=model_info.model_path,
            tokenizer_path=model_info.tokenizer_path,
            max_context_length=model_info.max_context_length,
            vocab_size=model_info.vocab_size,
            eos_token_ids=tuple(model_info.eos_token_ids),
            bos_token_id=model_info.bos_token_id if model_info.bos_token_id > 0 else None,
            is_generation=model_info.is_generation,
            model_type=model_info.model_type,
            page_size=max(1, int(args.get("page_size") or 1)),
            kv_capacity_tokens=int(server_info.max_total_num_tokens or args.get("max_total_num_tokens") or 0),
            disaggregation_mode=str(args.get("disaggregation_mode") or "null"),
            bootstrap_port=int(bootstrap) if bootstrap else None,
            dp_size=max(1, int(args.get("dp_size") or 1)),
            max_running_requests=max(0, int(args.get("max_running_requests") or 0)),
            default_sampling=defaults,
        )


class Worker:
    """A worker as the gateway tracks it. Mutated only on the event loop."""

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
    ) -> None:
        if role not in ROLES:
            raise ValueError(f"unknown worker role {role!r}; expected one of {ROLES}")
        self.client = client
        self.url = client.url
        self.id = client.address.target
        self.info = info
        self.role = role
        self.bootstrap_port = bootstrap_port if bootstrap_port is not None else info.bootstrap_port
        self.load = WorkerLoad()
        # Other gateway processes' outstanding work here, summed (set by gateway.sync; its
        # queued_prefill_tokens is their uncached part). Policies see local + remote,
        # draining waits for the local part only.
        self.remote_load = WorkerLoad()
        self.breaker = breaker or CircuitBreaker()
        self.progress = progress or ProgressTracker()  # what the progress watchdog judges
        self.healthy = True
        self.draining = False
        self.polled: LoadSnapshot | None = None
        self.polled_at = 0.0
        self._loads_view: tuple[LoadSnapshot, float, LoadSnapshot] | None = None  # (polled, at, view)
        self._view: tuple[tuple[object, ...], WorkerView] | None = None  # (what it was built from, view)
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

    def load_figures(self) -> tuple[int, int]:
        """(requests in flight, prompt tokens with no first message yet), for the watchdog."""
        return self.load.in_flight, self.load.queued_prefill_tokens

    def trip(self, reason: str) -> None:
        """Out of rotation now (the watchdog saw it stop); half-open trials bring it back."""
        self.breaker.trip(reason)
        self.suspect = True

    def loads_view(self) -> LoadSnapshot | None:
        """The last polled load with its age; one copy per poll and 10 ms (a policy reads it
        for every worker on every request, and ``dataclasses.replace`` is dear)."""
        polled = self.polled
        if polled is None:
            return None
        now = time.monotonic()
        cached = self._loads_view
        if cached is not None and cached[0] is polled and now - cached[1] < LOADS_VIEW_REUSE_S:
            return cached[2]
        view = dataclasses.replace(polled, age_s=max(0.0, now - self.polled_at))
        self._loads_view = (polled, now, view)
        return view

    def view(self) -> WorkerView:
        """What a policy may know of this worker now. The router asks for every worker of a
        pool on every request and the figures rarely change between two requests, so the
        last view is handed out again while every figure it was built from is the same
        (a frozen dataclass of 13 fields costs more to build than its key to compare)."""
        load, remote, info = self.load, self.remote_load, self.info
        key = (
            self.available, load.in_flight, load.queued_prefill_tokens, load.running_decode_tokens,
            remote.in_flight, remote.queued_prefill_tokens, remote.running_decode_tokens, self.loads_view(),
            info.kv_capacity_tokens, info.page_size, info.max_running_requests, self.bootstrap_port,
            self.id, self.url, self.role,
        )
        cached = getattr(self, "_view", None)  # (stand-ins for a worker in tests have none)
        if cached is not None and cached[0] == key:
            return cached[1]
        view = WorkerView(
            worker_id=self.id,
            url=self.url,
            role=self.role,
            available=key[0],
            in_flight=load.in_flight + remote.in_flight,
            queued_prefill_tokens=load.queued_prefill_tokens,
            remote_prefill_tokens=remote.queued_prefill_tokens,  # already the uncached part
            running_decode_tokens=load.running_decode_tokens + remote.running_decode_tokens,
            loads=key[7],
            kv_capacity_tokens=info.kv_capacity_tokens,
            page_size=info.page_size,
            bootstrap_port=self.bootstrap_port,
            max_running_requests=info.max_running_requests,
        )
        self._view = (key, view)
        return view

    def describe(self) -> dict[str, object]:
        """The admin API's view of this worker."""
        return {
            "id": self.id,
            "url": self.url,
            "kind": self.client.kind,
            # Every kind so far takes token ids, so routing sees what the worker caches.
            "token_ids": True,
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
            "kv_capacity_tokens": self.info.kv_capacity_tokens,
            "max_context_length": self.info.max_context_length,
            "bootstrap_port": self.bootstrap_port,
        }

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
