"""Per-request facts from the front door that the pipeline needs (ids, routing headers)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from gateway.protocol.ids import random_hex


@dataclass
class RequestContext:
    request_id: str = field(default_factory=random_hex)
    routing_key: str | None = None
    target_worker: str | None = None
    api_key_id: str | None = None
    worker_ids: list[str] = field(default_factory=list)  # who served it (for headers/logs)
    cache_salt: str | None = None  # the caller's key's salt (--cache-salt-per-key)
    priority: int | None = None  # admission order within the caller's key (x-priority header, else the body's)
    traceparent: str | None = None  # the client's W3C trace context (gRPC metadata)
    # Tokens a dead process generated for this request: the generation goes on from them
    # (a background response continued elsewhere, ``Engine.start_from_journal``).
    journal_ids: list[int] | None = None
    # Set by a front door that defers admission until the batch size is known.
    admit: Callable[[int], Awaitable[None]] | None = field(default=None, repr=False, compare=False)

    async def reserve(self, prompts: int) -> None:
        """Take one admission slot (and one rate-limit token) per prompt of a batch,
        before any tokenization or worker work; a no-op once taken or where the door
        admitted the request itself."""
        admit, self.admit = self.admit, None
        if admit is not None:
            await admit(prompts)

    def sub_id(self, index: int) -> str:
        """The worker-side request id of prompt ``index`` in a batch."""
        return self.request_id if index == 0 else f"{self.request_id}-{index}"

    def response_id(self, prefix: str) -> str:
        return f"{prefix}-{self.request_id}"
