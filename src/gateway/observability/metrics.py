"""Prometheus metrics for one gateway: request outcomes, pipeline timings, routing quality.

Each gateway owns its own ``CollectorRegistry`` (tests run many gateways in one
process, and the default global registry would mix them). Labels are bounded:
endpoints are route templates, models are names the gateway resolved itself,
workers are registered ids, policy reasons are fixed strings. Nothing a client
types (prompts, keys, unknown model names, request ids) ever becomes a label.

Live worker state (in flight, health, breaker) is read from the registry at
scrape time by ``WorkerCollector`` rather than mirrored into gauges.

For the admission module: ``metrics.queue_depth`` (read from ``state.admission`` at scrape time)
and ``metrics.admission_rejections.labels(reason="queue_full").inc()`` with
reason one of ``ADMISSION_REASONS``.
"""

from __future__ import annotations

import time
from bisect import bisect_left
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.values import MutexValue

from gateway.observability.request_log import current_record
from gateway.pipeline.observer import PipelineObserver
from gateway.pipeline.offpath import later, run_pending

# No ``*_created`` series: one more line per counter and histogram (half of /metrics)
# that dashboards never read. The switch is prometheus_client's own, process-wide.
disable_created_metrics()

# Seconds: from sub-millisecond gateway stages to multi-minute generations.
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)
STAGE_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 120, 600)
TOKEN_BUCKETS = (0, 16, 64, 256, 1024, 4096, 16384, 65536)
# Seconds per output token: decode steps are milliseconds to a few hundred ms.
PER_TOKEN_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05,
                     0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 2.5, 5.0)

STAGES = ("template", "tokenize", "select", "first_token", "relay")
ADMISSION_REASONS = ("queue_full", "queue_timeout", "rate_limited", "shutting_down")
NO_MODEL = "none"  # label for requests that never resolved a model (bad input, 404)

if TYPE_CHECKING:
    from gateway.observability.tracing import Tracing

__all__ = ["CONTENT_TYPE_LATEST", "GatewayMetrics"]


class GatewayMetrics(PipelineObserver):
    """Every series one gateway exports; also the pipeline's observer."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry(auto_describe=True)
        # serve --processes N: merges the siblings' expositions into this one's (server.process_set)
        self.federate: Callable[[bytes], Awaitable[bytes]] | None = None
        self.tracing: Tracing | None = None  # set by the gateway when --otlp-traces-endpoint is on
        r = self.registry
        self.requests = Counter(
            "token_gateway_requests", "requests answered (HTTP, and gRPC as 'grpc METHOD' with the HTTP-equivalent status), by endpoint, model and status code",
            ["endpoint", "model", "status"], registry=r,
        )
        self.latency = Histogram(
            "token_gateway_request_duration_seconds", "request time from arrival to the last byte (or gRPC message) sent",
            ["endpoint"], buckets=LATENCY_BUCKETS, registry=r,
        )
        self.ttft = Histogram(
            "token_gateway_time_to_first_token_seconds",
            "streaming requests: time from arrival to the first event sent to the client",
            ["endpoint"], buckets=LATENCY_BUCKETS, registry=r,
        )
        # Generation timings by model and worker (both bounded: resolved names, registered ids).
        self.gen_ttft = Histogram(
            "token_gateway_worker_time_to_first_token_seconds",
            "time from the request's arrival to the first token from the worker, by model and worker",
            ["model", "worker"], buckets=LATENCY_BUCKETS, registry=r,
        )
        self.tpot = Histogram(
            "token_gateway_time_per_output_token_seconds",
            "per request: (last token time - first token time) / (output tokens - 1), by model and worker",
            ["model", "worker"], buckets=PER_TOKEN_BUCKETS, registry=r,
        )
        self.itl = Histogram(
            "token_gateway_inter_token_latency_seconds",
            "gap between consecutive token messages from the worker, per token, by model and worker",
            ["model", "worker"], buckets=PER_TOKEN_BUCKETS, registry=r,
        )
        self.e2e = Histogram(
            "token_gateway_e2e_request_latency_seconds",
            "time from the request's arrival to the generation's last token, by model and worker",
            ["model", "worker"], buckets=LATENCY_BUCKETS, registry=r,
        )
        self.in_flight = Gauge(
            "token_gateway_http_requests_in_flight", "HTTP requests being handled now", registry=r,
        )
        self.in_flight_add = gauge_adder(self.in_flight)  # +1 / -1 per HTTP request
        self.stage_seconds = Histogram(
            "token_gateway_stage_duration_seconds",
            "time spent in each pipeline stage (template, tokenize, select, first_token, relay)",
            ["stage"], buckets=STAGE_BUCKETS, registry=r,
        )
        self.decisions = Counter(
            "token_gateway_policy_decisions", "worker choices by policy and the reason it gave",
            ["policy", "reason"], registry=r,
        )
        self.retries = Counter(
            "token_gateway_retries", "attempts that failed before output and were retried on another worker",
            ["worker", "code"], registry=r,
        )
        self.resumes = Counter(
            "token_gateway_resumes", "streams broken after output started and continued on another worker, by the worker that failed and outcome (ok, failed)",
            ["worker", "outcome"], registry=r,
        )
        self.worker_streams = Counter(
            "token_gateway_worker_streams", "worker generate streams that ended, by outcome",
            ["worker", "outcome"], registry=r,
        )
        self.cached_predicted = Counter(
            "token_gateway_cached_tokens_predicted",
            "prompt tokens the routing policy expected the chosen worker to have cached",
            ["model"], registry=r,
        )
        self.cached_reported = Counter(
            "token_gateway_cached_tokens_reported",
            "prompt tokens the worker reported as cached (usage.cached_tokens)",
            ["model"], registry=r,
        )
        self.prediction_error = Histogram(
            "token_gateway_cached_tokens_prediction_error_tokens",
            "absolute difference between predicted and reported cached tokens per successful stream",
            ["model"], buckets=TOKEN_BUCKETS, registry=r,
        )
        self.prompt_tokens = Counter(
            "token_gateway_prompt_tokens", "prompt tokens sent to workers", ["model"], registry=r,
        )
        self.completion_tokens = Counter(
            "token_gateway_completion_tokens", "tokens generated by workers", ["model"], registry=r,
        )
        self.queue_depth = Gauge(
            "token_gateway_queue_depth", "requests waiting for admission", registry=r,
        )
        self.admission_rejections = Counter(
            "token_gateway_admission_rejections", "requests refused by admission control, by reason",
            ["reason"], registry=r,
        )
        for reason in ADMISSION_REASONS:
            self.admission_rejections.labels(reason=reason)
        for stage in STAGES:
            self.stage_seconds.labels(stage=stage)
        self._children: dict[tuple[int, tuple[str, ...]], Any] = {}
        self._recorders: dict[tuple[int, tuple[str, ...]], Any] = {}
        self._stage_observe: dict[str, Any] = {}
        # The recorders each per-request update below uses together, by its labels: one dict
        # read per update instead of a ``recorder`` call per series (each made on first use,
        # as ``recorder`` would, never before).
        self._done_series: dict[str, tuple[Any, Any, Any]] = {}  # model -> predicted, reported, error
        self._token_series: dict[str, tuple[Any, Any]] = {}  # model -> prompt, completion tokens
        self._timing_series: dict[tuple[str, str], tuple[Any, Any]] = {}  # (model, worker) -> ttft, e2e

    def _child(self, metric: Any, *values: str) -> Any:
        """``metric.labels(*values)`` (values in the metric's label order), memoized:
        prometheus_client validates and locks on every ``labels()`` call, about ten per
        request on the request path. Children are never removed, so a memo stays valid."""
        key = (id(metric), values)
        found = self._children.get(key)
        if found is None:
            found = self._children[key] = metric.labels(*values)
        return found

    def recorder(self, metric: Any, *values: str) -> Any:
        """``_child``'s child as a ``FastChild`` where it can be (memoized the same way): the
        per-request counters and histograms, about fifteen updates per request."""
        key = (id(metric), values)
        found = self._recorders.get(key)
        if found is None:
            found = self._recorders[key] = fast_child(self._child(metric, *values))
        return found

    # ------------------------------------------------------------ exposition
    def render(self) -> bytes:
        run_pending()  # a scrape sees every update already made
        return generate_latest(self.registry)

    # ------------------------------------------------------------ PipelineObserver
    def model_resolved(self, model: str) -> None:
        record = current_record()
        if record is not None and not record.model:
            record.model = model

    def stage(self, name: str, seconds: float) -> None:
        observe = self._stage_observe.get(name)
        if observe is None:  # one lookup per stage name for the process's life, not per request
            observe = self._stage_observe[name] = self.recorder(self.stage_seconds, name).observe
        later(observe, seconds)  # off the request's path
        if self.tracing is not None:
            self.tracing.stage(name, seconds)

    def selected(self, policy: str, reason: str, worker_id: str) -> None:
        later(self.recorder(self.decisions, policy, reason).inc)
        record = current_record()
        if record is not None and record.routed_s is None:
            record.routed_s = time.perf_counter() - record.started
        if self.tracing is not None:
            self.tracing.annotate(worker=worker_id, policy=policy, policy_reason=reason)

    def retried(self, worker_id: str, code: str) -> None:
        self.retries.labels(worker=worker_id, code=code).inc()

    def resumed(self, worker_id: str, outcome: str) -> None:
        self.resumes.labels(worker=worker_id, outcome=outcome).inc()

    def worker_done(
        self, model: str, worker_id: str, *, predicted_cached: int, reported_cached: int, success: bool,
        sent_prompt: int = 0, reported_prompt: int = 0, aborted: bool = False,
    ) -> None:
        outcome = "aborted" if aborted else "ok" if success else "error"
        self.recorder(self.worker_streams, worker_id, outcome).inc()
        if outcome != "ok":
            return
        series = self._done_series.get(model)
        if series is None:
            series = self._done_series[model] = (
                self.recorder(self.cached_predicted, model), self.recorder(self.cached_reported, model),
                self.recorder(self.prediction_error, model),
            )
        series[0].inc(predicted_cached)
        series[1].inc(reported_cached)
        series[2].observe(abs(reported_cached - predicted_cached))

    def generation_done(
        self, model: str, worker_id: str, *, prompt_tokens: int, completion_tokens: int, cached_tokens: int
    ) -> None:
        series = self._token_series.get(model)
        if series is None:
            series = self._token_series[model] = (
                self.recorder(self.prompt_tokens, model), self.recorder(self.completion_tokens, model),
            )
        series[0].inc(prompt_tokens)
        series[1].inc(completion_tokens)
        record = current_record()
        if record is not None:
            record.add_generation(model, worker_id, prompt_tokens, completion_tokens, cached_tokens)

    def generation_timing(
        self, model: str, worker_id: str, *, first_token_at: float, last_token_at: float,
        output_tokens: int, token_gaps: list[float],
    ) -> None:
        record = current_record()
        if record is not None:
            series = self._timing_series.get((model, worker_id))
            if series is None:
                series = self._timing_series[(model, worker_id)] = (
                    self.recorder(self.gen_ttft, model, worker_id), self.recorder(self.e2e, model, worker_id),
                )
            series[0].observe(max(0.0, first_token_at - record.started))
            series[1].observe(max(0.0, last_token_at - record.started))
        if output_tokens > 1:
            self.recorder(self.tpot, model, worker_id).observe(
                (last_token_at - first_token_at) / (output_tokens - 1)
            )
        if token_gaps:
            observe_many(self._child(self.itl, model, worker_id), token_gaps)


class FastChild:
    """A labelled counter or histogram child updated through its own value objects, as its
    ``inc`` / ``observe`` would (the same lock, the same bucket), minus the checks and calls
    prometheus_client repeats on every update: a histogram's bucket found by bisection
    instead of a walk over the bounds. Only for children whose values are plain
    ``MutexValue``s (not multiprocess mode: ``fast_child`` leaves those as they are)."""

    __slots__ = ("_bounds", "_buckets", "_child", "_sum", "_value")

    def __init__(self, child: Any) -> None:
        self._child = child
        self._value: Any = getattr(child, "_value", None)  # a counter's
        self._bounds: Any = getattr(child, "_upper_bounds", None)  # a histogram's
        self._buckets: Any = getattr(child, "_buckets", None)
        self._sum: Any = getattr(child, "_sum", None)

    def inc(self, amount: float = 1) -> None:
        if amount < 0:
            self._child.inc(amount)  # prometheus_client's own error
            return
        value = self._value
        with value._lock:
            value._value += amount

    def observe(self, amount: float) -> None:
        if amount != amount:  # NaN lands in no bucket: prometheus_client's own walk says so
            self._child.observe(amount)
            return
        bucket = self._buckets[bisect_left(self._bounds, amount)]
        with bucket._lock:
            bucket._value += 1
        total = self._sum
        with total._lock:
            total._value += amount


def fast_child(child: Any) -> Any:
    """``child`` as a ``FastChild`` when its values are plain ``MutexValue``s, else itself."""
    parts = [getattr(child, "_value", None)] if isinstance(child, Counter) else (
        [getattr(child, "_sum", None), *getattr(child, "_buckets", [None])] if isinstance(child, Histogram) else [None]
    )
    if isinstance(child, Histogram) and not isinstance(getattr(child, "_upper_bounds", None), list):
        return child
    if not all(type(v) is MutexValue for v in parts):
        return child
    return FastChild(child)


def gauge_adder(gauge: Gauge) -> Callable[[float], None]:
    """``gauge.inc`` (a negative amount: ``dec``) as one call: with a plain ``MutexValue``
    (not multiprocess mode) its value is added to under its own lock, as ``inc`` does,
    without the two calls and checks ``inc`` repeats per update (twice per request for
    the in-flight gauge)."""
    value = getattr(gauge, "_value", None)
    if type(value) is not MutexValue or getattr(gauge, "_is_most_recent", True) or gauge._labelnames:
        return gauge.inc
    lock = value._lock

    def add(amount: float) -> None:
        with lock:
            value._value += amount

    return add


def observe_many(child: Histogram, values: list[float]) -> None:
    """``child.observe(v)`` for each value, with one bucket pass per value done by bisect
    and one locked increment per touched bucket (a long generation has thousands of gaps)."""
    bounds = getattr(child, "_upper_bounds", None)
    buckets = getattr(child, "_buckets", None)
    total = getattr(child, "_sum", None)
    if bounds is None or buckets is None or total is None:  # another prometheus_client layout
        for v in values:
            child.observe(v)
        return
    counts: dict[int, int] = {}
    for v in values:
        i = bisect_left(bounds, v)
        counts[i] = counts.get(i, 0) + 1
    for i, n in counts.items():
        buckets[i].inc(n)
    total.inc(sum(values))
