"""Per-request facts for logs: the request id, who served it, its tokens; JSON log lines.

The HTTP middleware opens a ``RequestRecord`` for each request and puts it in a
context variable, so every log line written while the request runs (in the
handler, the pipeline, or the tasks they spawn) carries its ``request_id``.
That id is also the gRPC request id the worker sees, so one grep follows a
request across the gateway and the worker. When the request ends the
middleware writes one access-log line from the record.
"""

from __future__ import annotations

import contextvars
import logging
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import orjson

ACCESS_LOGGER = "gateway.access"
_access_log = logging.getLogger(ACCESS_LOGGER)  # one object per name for the process's life: looked up once

# A client's X-Request-Id is reused only if it is short and plain: it becomes the
# worker-side request id and appears in logs, so no spaces, quotes or controls.
_SANE_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,127}")

_current: contextvars.ContextVar[RequestRecord | None] = contextvars.ContextVar("token_gateway_request", default=None)


def sane_request_id(value: str | None) -> str | None:
    """``value`` if it is fit to be a request id (1-128 of ``[A-Za-z0-9._:-]``), else None."""
    if value and _SANE_ID.fullmatch(value):
        return value
    return None


@dataclass
class RequestRecord:
    """What one HTTP request did, filled in as it runs."""

    method: str
    path: str
    started: float = field(default_factory=time.perf_counter)
    request_id: str = ""
    endpoint: str = ""
    model: str = ""
    status: int = 0
    workers: list[str] = field(default_factory=list)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    ttft_s: float | None = None
    queued_s: float | None = None  # waited for admission (the gateway's queue), summed over a batch's slots
    routed_s: float | None = None  # from arrival until the first worker was chosen (admission, render, tokenize, route)

    def add_generation(self, model: str, worker_id: str, prompt: int, completion: int, cached: int) -> None:
        self.model = self.model or model
        if worker_id not in self.workers:
            self.workers.append(worker_id)
        self.prompt_tokens += prompt
        self.completion_tokens += completion
        self.cached_tokens += cached

    def access_fields(self, latency_s: float) -> dict[str, Any]:
        out: dict[str, Any] = {
            "request_id": self.request_id,
            "method": self.method,
            "endpoint": self.endpoint or self.path,
            "status": self.status,
            "latency_ms": round(latency_s * 1e3, 2),
        }
        if self.model:
            out["model"] = self.model
        if self.workers:
            out["worker"] = ",".join(self.workers)
        if self.ttft_s is not None:
            out["ttft_ms"] = round(self.ttft_s * 1e3, 2)
        if self.queued_s is not None:
            out["queue_ms"] = round(self.queued_s * 1e3, 2)
        if self.routed_s is not None:
            out["routed_ms"] = round(self.routed_s * 1e3, 2)
        if self.prompt_tokens or self.completion_tokens:
            out["prompt_tokens"] = self.prompt_tokens
            out["completion_tokens"] = self.completion_tokens
            out["cached_tokens"] = self.cached_tokens
        return out


# The record of the request this code runs for, or None: the context variable's own ``get``
# (a C call; read about seven times per request, a Python wrapper frame each time).
current_record: Callable[[], RequestRecord | None] = _current.get


def bind_record(record: RequestRecord) -> contextvars.Token[RequestRecord | None]:
    return _current.set(record)


def unbind_record(token: contextvars.Token[RequestRecord | None]) -> None:
    _current.reset(token)


def log_access(record: RequestRecord, latency_s: float) -> None:
    logger = _access_log
    if not logger.isEnabledFor(logging.INFO):
        return  # access lines are off (--log-level warning): their fields are not built either
    fields = record.access_fields(latency_s)
    logger.info(
        "%s %s %s %.1fms", record.method, fields["endpoint"], record.status, fields["latency_ms"],
        extra={"access": fields},
    )


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message, request id, access fields."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": round(record.created, 6),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        access = getattr(record, "access", None)
        if isinstance(access, dict):
            out.update(access)
        else:
            current = _current.get()
            if current is not None and current.request_id:
                out["request_id"] = current.request_id
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return orjson.dumps(out, default=str).decode()


_TEXT_FIELDS = ("model", "worker", "prompt_tokens", "completion_tokens")  # the access fields a text line shows


class TextFormatter(logging.Formatter):
    """The plain format, with ``[request_id]`` when a line belongs to a request."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        access = getattr(record, "access", None)
        current = _current.get()
        rid = access.get("request_id") if isinstance(access, dict) else (current.request_id if current else "")
        if isinstance(access, dict):
            parts = []  # a plain loop: no generator per access line
            for k in _TEXT_FIELDS:
                if k in access:
                    parts.append(f"{k}={access[k]}")
            line = f"{line} {' '.join(parts)}".rstrip()
        return f"{line} [{rid}]" if rid else line
