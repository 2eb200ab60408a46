"""Retry settings and back-off: the one retry policy of the gateway."""

from __future__ import annotations

import random
from dataclasses import dataclass

from gateway.settings import option
from gateway.workers.transport import RETRYABLE_CODES, CallCode

# The names of the worker call codes retried by default (``workers/transport.py`` says why).
DEFAULT_RETRY_CODES = [code.name for code in RETRYABLE_CODES]


@dataclass
class RetryConfig:
    max_attempts: int = option(3, "attempts per request (1 = no retry); only before any output reached the client")
    backoff_base_s: float = option(0.02, "first retry back-off in seconds (doubles each attempt, full jitter)")
    backoff_max_s: float = option(1.0, "cap on one back-off sleep, seconds")
    retry_codes: list[str] = option(list(DEFAULT_RETRY_CODES), "gRPC status codes that are retried on another worker")

    def retryable(self, code: CallCode | None) -> bool:
        return code is not None and code.name in self.retry_codes

    def backoff(self, attempt: int, rng: random.Random | None = None) -> float:
        """Full-jitter exponential back-off before attempt ``attempt`` (1-based retries)."""
        cap = min(self.backoff_max_s, self.backoff_base_s * (2 ** max(0, attempt - 1)))
        return (rng or random).uniform(0, cap)
