"""OpenTelemetry tracing (optional extra ``token-gateway[otel]``), exported over OTLP gRPC.

Off unless ``--otlp-traces-endpoint`` is set; then each request gets a server span
(HTTP: ``POST /v1/chat/completions``; gRPC: ``grpc StreamCompletion``) that continues
the client's ``traceparent`` (HTTP header or gRPC metadata) when one is sent, with one
child span per pipeline stage: ``template``, ``tokenize``, ``select``, ``dispatch``
(sending to the worker until its first token) and ``relay`` (first token to the
stream's end). The stage spans are made from the timings the pipeline already reports
to its observer (start = end - duration), so the pipeline itself has no tracing code.
Worker calls carry the request span's ``traceparent`` in their gRPC metadata.

Off, the cost on the hot path is one ``is None`` test per hook and one ContextVar read
per worker call (``token-gateway bench tracing`` measures it).
"""

from __future__ import annotations

import contextvars
import logging
import time
from dataclasses import dataclass
from typing import Any

from gateway.settings import option
from gateway.workers.trace_context import TRACEPARENT

log = logging.getLogger(__name__)

# pipeline stage (observer name) -> span name
STAGE_SPANS = {"template": "template", "tokenize": "tokenize", "select": "select",
               "first_token": "dispatch", "relay": "relay"}


@dataclass
class TracingConfig:
    otlp_traces_endpoint: str | None = option(
        None, "OTLP gRPC collector for traces, host:port or http(s)://host:port (unset: no tracing; needs token-gateway[otel])"
    )
    otlp_service_name: str = option("token-gateway", "service.name of the exported spans")
    trace_sample_ratio: float = option(1.0, "share of new traces recorded (requests with a traceparent follow the client's decision)")


class TracingUnavailableError(RuntimeError):
    """--otlp-traces-endpoint was given but the OpenTelemetry packages are not installed."""


@dataclass(slots=True)
class RequestSpan:
    span: Any
    token: contextvars.Token[Any]
    parent_token: contextvars.Token[str | None]


_CURRENT: contextvars.ContextVar[Any] = contextvars.ContextVar("token_gateway_request_span", default=None)


class Tracing:
    """One gateway's tracer provider and exporter (not the global provider: tests run many)."""

    def __init__(self, config: TracingConfig, *, exporter: Any = None, schedule_delay_ms: int = 1000) -> None:
        try:
            from opentelemetry import trace
            from opentelemetry.sdk.resources import Resource
            from opentelemetry.sdk.trace import TracerProvider
            from opentelemetry.sdk.trace.export import BatchSpanProcessor
            from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased
            from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
        except ImportError as exc:
            raise TracingUnavailableError(
                "--otlp-traces-endpoint needs OpenTelemetry: pip install 'token-gateway[otel]'"
            ) from exc
        if exporter is None:
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

            endpoint = config.otlp_traces_endpoint or "localhost:4317"
            secure = endpoint.startswith("https://")
            exporter = OTLPSpanExporter(endpoint=endpoint, insecure=not secure)
        self._trace = trace
        self.provider = TracerProvider(
            resource=Resource.create({"service.name": config.otlp_service_name}),
            sampler=ParentBased(TraceIdRatioBased(config.trace_sample_ratio)),
        )
        self.provider.add_span_processor(BatchSpanProcessor(exporter, schedule_delay_millis=schedule_delay_ms))
        self.tracer = self.provider.get_tracer("token-gateway")
        self._propagator = TraceContextTextMapPropagator()
        self._server_kind = trace.SpanKind.SERVER

    # ------------------------------------------------------------ request spans
    def start_request(self, name: str, traceparent: str | None, attributes: dict[str, Any] | None = None) -> RequestSpan:
        """Open the request's server span (continuing ``traceparent``) and make it current."""
        parent = self._propagator.extract({"traceparent": traceparent}) if traceparent else None
        span = self.tracer.start_span(name, context=parent, kind=self._server_kind, attributes=attributes)
        carrier: dict[str, str] = {}
        self._propagator.inject(carrier, context=self._trace.set_span_in_context(span))
        return RequestSpan(span, _CURRENT.set(span), TRACEPARENT.set(carrier.get("traceparent")))

    def end_request(self, handle: RequestSpan, *, name: str | None = None, status: int = 0,
                    attributes: dict[str, Any] | None = None) -> None:
        span = handle.span
        if name:
            span.update_name(name)
        if attributes:
            span.set_attributes({k: v for k, v in attributes.items() if v is not None})
        if status:
            span.set_attribute("http.response.status_code", status)
            if status >= 500:
                from opentelemetry.trace import Status, StatusCode

                span.set_status(Status(StatusCode.ERROR))
        span.end()
        for var, token in ((_CURRENT, handle.token), (TRACEPARENT, handle.parent_token)):
            try:
                var.reset(token)  # type: ignore[arg-type]
            except ValueError:  # ended in another context (a stream's own task): nothing to restore
                pass

    # ------------------------------------------------------------ pipeline hooks
    def stage(self, name: str, seconds: float) -> None:
        """A finished stage of the current request as a child span ending now."""
        parent = _CURRENT.get()
        if parent is None:
            return
        end = time.time_ns()
        span = self.tracer.start_span(
            STAGE_SPANS.get(name, name), context=self._trace.set_span_in_context(parent),
            start_time=end - int(seconds * 1e9),
        )
        span.end(end_time=end)

    def annotate(self, **attributes: Any) -> None:
        """Attributes on the current request span (the chosen worker, the policy's reason)."""
        span = _CURRENT.get()
        if span is not None:
            span.set_attributes({f"gateway.{k}": v for k, v in attributes.items() if v is not None})

    def shutdown(self) -> None:
        """Export what is buffered, then stop the exporter."""
        try:
            self.provider.force_flush(5000)
            self.provider.shutdown()
        except Exception:  # an unreachable collector must not fail shutdown
            log.warning("tracing: could not flush spans to the collector", exc_info=True)


def make_tracing(config: TracingConfig) -> Tracing | None:
    """A ``Tracing`` when an endpoint is configured, else None (the no-op)."""
    if not config.otlp_traces_endpoint:
        return None
    return Tracing(config)
