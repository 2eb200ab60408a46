"""Retry settings and back-off: the one retry policy of the gateway."""

from __future__ import annotations

import random
from dataclasses import dataclass

import grpc

from gateway.settings import option

# Codes that say "this worker could not take the request", not "the request is bad".
# CANCELLED is the worker's side cancelling (a server going down resets its streams):
# the gateway's own cancels surface as asyncio.CancelledError, never as this code.
DEFAULT_RETRY_CODES = ["UNAVAILABLE", "RESOURCE_EXHAUSTED", "ABORTED", "INTERNAL", "UNKNOWN", "CANCELLED"]


@dataclass
class RetryConfig:
    max_attempts: int = option(3, "attempts per request (1 = no retry); only before any output reached the client")
    backoff_base_s: float = option(0.02, "first retry back-off in seconds (doubles each attempt, full jitter)")
    backoff_max_s: float = option(1.0, "cap on one back-off sleep, seconds")
    retry_codes: list[str] = option(list(DEFAULT_RETRY_CODES), "gRPC status codes that are retried on another worker")

    def retryable(self, code: grpc.StatusCode | None) -> bool:
        return code is not None and code.name in self.retry_codes

    def backoff(self, attempt: int, rng: random.Random | None = None) -> float:
        """Full-jitter exponential back-off before attempt ``attempt`` (1-based retries)."""
        cap = min(self.backoff_max_s, self.backoff_base_s * (2 ** max(0, attempt - 1)))
        return (rng or random).uniform(0, cap)
