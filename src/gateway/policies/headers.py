"""HTTP header names that carry routing hints (lower-case, as HTTP/2 and ASGI deliver them).

The server maps the first header present in each tuple onto ``RouteRequest``:
``ROUTING_KEY_HEADERS`` -> ``routing_key`` (used by the ``consistent_hash`` policy) and
``TARGET_WORKER_HEADERS`` -> ``target_worker`` (a worker id or url; honoured by every
policy before it makes its own choice). The ``x-smg-*`` names keep clients written for
SMG working unchanged.
"""

from __future__ import annotations

ROUTING_KEY_HEADERS: tuple[str, ...] = ("x-smg-routing-key", "x-routing-key")
TARGET_WORKER_HEADERS: tuple[str, ...] = ("x-smg-target-worker", "x-target-worker")
