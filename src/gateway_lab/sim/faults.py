"""Fault knobs of a simulated worker, mutable at runtime (tests flip them live)."""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import grpc

from gateway_lab.sim.config import SimConfig


def status_code(name: str) -> grpc.StatusCode:
    """The gRPC status code called ``name`` (e.g. "UNAVAILABLE")."""
    try:
        return grpc.StatusCode[name.strip().upper()]
    except KeyError:
        raise ValueError(f"unknown gRPC status code {name!r}") from None


@dataclass
class SimFaults:
    """Misbehaviours to inject; each is off at its default."""

    fail_after_tokens: int = -1  # end each sample with an error after k tokens...
    fail_share: float = 1.0  # ...in this share of requests (drawn per request, seeded)
    fail_status: str = "UNAVAILABLE"
    stall_s: float = 0.0  # go silent this long, once per request...
    stall_after_tokens: int = 0  # ...once this many tokens were sent (0: before the first)
    reject_status: str = ""  # refuse every Generate with this status
    exit_after_requests: int = -1  # die when Generate number k+1 arrives
    seed: int = 0
    _rng: random.Random = field(default_factory=random.Random, repr=False)

    def __post_init__(self) -> None:
        self._rng.seed(self.seed)

    def fail_after_for_next_request(self) -> int:
        """``fail_after_tokens`` if this request is one of the failing share, else -1."""
        if self.fail_after_tokens < 0:
            return -1
        if self.fail_share >= 1.0 or self._rng.random() < self.fail_share:
            return self.fail_after_tokens
        return -1

    @classmethod
    def from_config(cls, config: SimConfig) -> SimFaults:
        faults = cls(
            fail_after_tokens=config.fault_fail_after_tokens,
            fail_share=config.fault_fail_share,
            fail_status=config.fault_fail_status,
            stall_s=config.fault_stall_s,
            stall_after_tokens=config.fault_stall_after_tokens,
            reject_status=config.fault_reject_status,
            exit_after_requests=config.fault_exit_after_requests,
            seed=config.seed,
        )
        status_code(faults.fail_status)
        if faults.reject_status:
            status_code(faults.reject_status)
        return faults
