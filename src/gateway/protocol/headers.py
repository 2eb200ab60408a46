"""Every header (HTTP) and metadata key (gRPC) name the gateway reads or writes.

One module, at the lowest layer that needs them (the worker client, the front
doors, the Python client and the benchmarks all import it), so a name is spelt
once. Lower-case, as HTTP/2, ASGI and gRPC metadata deliver them.

Routing hints: the first header present in each tuple is used. ``ROUTING_KEY``
becomes ``RouteRequest.routing_key`` (the ``consistent_hash`` policy) and
``TARGET_WORKER`` ``RouteRequest.target_worker`` (a worker id or url, honoured by
every policy before its own choice). The ``x-smg-*`` names keep clients written
for SMG working unchanged.
"""

from __future__ import annotations

from collections.abc import Mapping

from gateway.protocol.errors import InvalidRequestError

ROUTING_KEY_HEADERS: tuple[str, ...] = ("x-smg-routing-key", "x-routing-key")
TARGET_WORKER_HEADERS: tuple[str, ...] = ("x-smg-target-worker", "x-target-worker")

AUTHORIZATION = "authorization"  # "Bearer KEY", to the gateway and from it to workers
REQUEST_ID = "x-request-id"  # the client's id for the request, echoed on the reply
WORKER_ID = "x-worker-id"  # on replies: the worker(s) that served the request
RETRY_AFTER = "retry-after"
PRIORITY = "x-priority"  # the request's priority in the admission queue (overrides the body's ``priority``)

# gRPC trailing metadata carrying the OpenAI error fields of a failed call.
ERROR_TYPE = "x-error-type"
ERROR_CODE = "x-error-code"
ERROR_PARAM = "x-error-param"
HTTP_STATUS = "x-http-status"


def bearer(api_key: str) -> tuple[str, str]:
    """The authorization header (metadata pair) for ``api_key``."""
    return (AUTHORIZATION, f"Bearer {api_key}")


def priority_header(headers: Mapping[str, str]) -> int | None:
    """The ``x-priority`` header as an int (None when absent); a 400 when it is not a 32-bit integer."""
    value = headers.get(PRIORITY)
    if not value:
        return None
    try:
        priority = int(value.strip())
    except ValueError:
        priority = 2**31
    if not -(2**31) <= priority < 2**31:
        raise InvalidRequestError(f"the {PRIORITY} header must be a 32-bit integer", param=PRIORITY)
    return priority


def first_header(headers: Mapping[str, str], names: tuple[str, ...]) -> str | None:
    """The value of the first of ``names`` present and non-empty in ``headers``."""
    for name in names:
        value = headers.get(name)
        if value:
            return value
    return None
