"""What a simulated worker has done, for tests, benchmarks and the exit report."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any


@dataclass
class SimCounters:
    """Lifetime totals of one worker (samples are the n sequences of a request)."""

    requests: int = 0  # Generate RPCs received
    rejected: int = 0  # refused by the reject fault knob
    invalid: int = 0  # refused with INVALID_ARGUMENT
    samples: int = 0  # sequences submitted to the scheduler
    finished: int = 0  # samples that ended with "stop" or "length"
    aborted: int = 0  # samples aborted (Abort RPC, client cancel)
    failed: int = 0  # samples ended by the fail-after-tokens fault
    prompt_tokens: int = 0  # prompt tokens of admitted samples
    cached_tokens: int = 0  # of which served from the prefix cache
    prefill_tokens: int = 0  # prompt tokens actually computed
    generated_tokens: int = 0
    steps: int = 0  # scheduler steps
    busy_seconds: float = 0.0  # simulated time spent in steps
    pd_rendezvous_ok: int = 0
    pd_rendezvous_failed: int = 0
    embeds: int = 0
    health_checks: int = 0

    @property
    def cache_hit_rate(self) -> float:
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    def as_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["busy_seconds"] = round(self.busy_seconds, 6)
        out["cache_hit_rate"] = round(self.cache_hit_rate, 6)
        return out
