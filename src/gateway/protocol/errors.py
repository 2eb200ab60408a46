"""Client-facing errors: one exception hierarchy, one OpenAI-shaped error body.

Every layer raises a ``GatewayError`` (or a subclass); the server is the one
place that turns it into an HTTP status and ``{"error": {...}}`` body, so the
status code and the ``type``/``code`` strings clients match on live here only.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from pydantic import BaseModel, ValidationError


class ErrorBody(BaseModel):
    """The inner object of an OpenAI error response."""

    message: str
    type: str
    param: str | None = None
    code: str | int | None = None


class ErrorResponse(BaseModel):
    """``{"error": {"message", "type", "param", "code"}}`` as OpenAI sends it."""

    error: ErrorBody

    def to_dict(self) -> dict[str, Any]:
        # OpenAI always sends all four keys (param/code as null), so keep the Nones.
        return self.model_dump()


class GatewayError(Exception):
    """A failure with a client-facing HTTP status, OpenAI error ``type`` and optional ``code``.

    ``retry_after`` (seconds) is a hint the server may turn into a Retry-After header.
    """

    status: int = 500
    type: str = "internal_error"
    code: str | None = None

    def __init__(
        self,
        message: str,
        *,
        status: int | None = None,
        type: str | None = None,
        param: str | None = None,
        code: str | None = None,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        if status is not None:
            self.status = status
        if type is not None:
            self.type = type
        if code is not None:
            self.code = code
        self.param = param
        self.retry_after = retry_after

    def to_response(self) -> ErrorResponse:
        return ErrorResponse(
            error=ErrorBody(message=self.message, type=self.type, param=self.param, code=self.code)
        )

    def to_dict(self) -> dict[str, Any]:
        """The JSON body (``{"error": {...}}``) to send with ``self.status``."""
        return self.to_response().to_dict()

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(status={self.status}, type={self.type!r}, "
            f"message={self.message!r}, param={self.param!r}, code={self.code!r})"
        )


class InvalidRequestError(GatewayError):
    """400: the request is malformed or asks for something unsupported."""

    status = 400
    type = "invalid_request_error"


class ContextLengthExceededError(InvalidRequestError):
    """400: prompt plus requested completion does not fit the model's context."""

    code = "context_length_exceeded"


class AuthenticationError(GatewayError):
    """401: missing or wrong API key."""

    status = 401
    type = "authentication_error"
    code = "invalid_api_key"


class PermissionDeniedError(GatewayError):
    """403: the key is valid but may not do this (e.g. admin endpoints)."""

    status = 403
    type = "permission_error"
    code = "permission_denied"


class NotFoundError(GatewayError):
    """404: no such route or object."""

    status = 404
    type = "not_found_error"
    code = "not_found"


class ModelNotFoundError(NotFoundError):
    """404 for an unknown ``model``, with OpenAI's type/code pair."""

    type = "invalid_request_error"
    code = "model_not_found"

    def __init__(self, model: str, *, message: str | None = None) -> None:
        super().__init__(
            message or f"The model '{model}' does not exist or is not served here.",
            param="model",
        )
        self.model = model


class RequestTimeoutError(GatewayError):
    """408: the client took too long to send its request."""

    status = 408
    type = "timeout_error"
    code = "request_timeout"


class PayloadTooLargeError(GatewayError):
    """413: body or prompt over the configured size limit."""

    status = 413
    type = "invalid_request_error"
    code = "payload_too_large"


class RateLimitError(GatewayError):
    """429: over a rate or concurrency limit."""

    status = 429
    type = "rate_limit_error"
    code = "rate_limit_exceeded"


class WorkerError(GatewayError):
    """502: a worker failed or answered with something unusable."""

    status = 502
    type = "worker_error"
    code = "worker_error"


class ServiceUnavailableError(GatewayError):
    """503: the gateway cannot serve now (shutting down, overloaded)."""

    status = 503
    type = "service_unavailable"
    code = "service_unavailable"


class NoWorkerError(ServiceUnavailableError):
    """503: no healthy worker can take the request."""

    code = "no_worker"


class GatewayTimeoutError(GatewayError):
    """504: the worker did not answer in time."""

    status = 504
    type = "timeout"
    code = "timeout"


class ParamError(ValueError):
    """A validator's complaint about a named field, raised from a model-level check.

    ``param`` is relative to the model being validated (``"top_logprobs"``); the
    converter below prefixes the model's own location, so a message-level rule
    reports ``messages.[3].tool_call_id`` rather than just ``messages.[3]``.
    """

    def __init__(self, param: str, message: str) -> None:
        super().__init__(message)
        self.param = param


# Pydantic inserts a segment per union member / validator into an error's ``loc``
# (``'str'``, ``'list[int]'``, ``'function-after[...]'``, model class names). They
# mean nothing to an API client, so they are dropped from the reported ``param``.
_TYPE_TAGS = frozenset({"str", "int", "float", "bool", "none", "list", "dict", "tuple", "set"})


def _is_type_tag(segment: str) -> bool:
    return (
        segment in _TYPE_TAGS
        or "[" in segment
        or "-" in segment
        or (segment[:1].isupper() and not segment.isupper())
    )


def format_param(loc: Sequence[int | str]) -> str | None:
    """Render a pydantic ``loc`` as OpenAI does: ``messages.[0].content``."""
    parts: list[str] = []
    for segment in loc:
        if isinstance(segment, int):
            parts.append(f"[{segment}]")
        elif not _is_type_tag(segment):
            parts.append(segment)
    return ".".join(parts) or None


def _clean_message(error: Any) -> str:
    if error["type"] == "model_type" and not error["loc"]:
        return "the request body must be a JSON object"
    msg: str = error["msg"]
    # Our own validators raise ValueError; pydantic prefixes those with "Value error, ".
    for prefix in ("Value error, ", "Assertion failed, "):
        if msg.startswith(prefix):
            return msg[len(prefix) :]
    return msg


def _error_param(error: Any) -> str | None:
    loc = list(error["loc"])
    cause = (error.get("ctx") or {}).get("error")
    if isinstance(cause, ParamError):
        loc.extend(cause.param.split("."))
    return format_param(loc)


def _is_ancestor(param: str | None, of: str | None) -> bool:
    if param is None:
        return True
    return of is not None and (of == param or of.startswith(param + "."))


def validation_error_to_gateway(exc: ValidationError, at: tuple[str, int] | None = None) -> InvalidRequestError:
    """A 400 naming the first offending field (``param``) with a readable message.

    Errors of one union field arrive as one entry per union member; they are
    merged so the client reads "prompt: expected ..." once, not five times.
    ``at``: the errors are of a slice of the request's list field of that name,
    starting at that index (a long list validated in steps).
    """
    errors = exc.errors(include_url=False)
    if at is not None:
        name, start = at
        errors = [
            {**e, "loc": (name, start + e["loc"][0], *e["loc"][1:])} if e["loc"] and type(e["loc"][0]) is int else e
            for e in errors
        ]
    if not errors:
        return InvalidRequestError("Invalid request.")
    first_param = _error_param(errors[0])
    same = [e for e in errors if _error_param(e) == first_param]
    messages = _unique(_clean_message(e) for e in same)
    text = messages[0] if len(messages) == 1 else "; or ".join(messages[:4])
    other_params = _unique(
        p for p in (_error_param(e) for e in errors) if not _is_ancestor(p, first_param)
    )
    where = f"'{first_param}'" if first_param else "request body"
    message = f"Invalid {where}: {text}"
    if other_params:
        message += f" (also invalid: {', '.join(str(p) for p in other_params[:5])})"
    return InvalidRequestError(message, param=first_param)


def _unique(items: Iterable[Any]) -> list[Any]:
    seen: list[Any] = []
    for item in items:
        if item not in seen:
            seen.append(item)
    return seen


class QueueFullError(RateLimitError):
    """429: every slot is busy and the admission queue is full."""

    code = "queue_full"


class QueueTimeoutError(RequestTimeoutError):
    """408: the request waited in the admission queue longer than allowed."""

    code = "queue_timeout"


class RateLimitedError(RateLimitError):
    """429: this API key is over its request rate."""

    code = "rate_limit_exceeded"


class ShuttingDownError(ServiceUnavailableError):
    """503: the gateway is shutting down and takes no new requests."""

    code = "shutting_down"
