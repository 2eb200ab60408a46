"""How many processes of a ``serve --processes N`` set should take connections, from the host's CPU.

A second serving process pays off only when it gets a core the rest of the host does not
need. Each process of a set spends more CPU per request than one process serving
everything (each event loop pays its own wake-ups, and each keeps its siblings' routing
decisions), and on a host whose cores other work keeps busy (the workers' schedulers,
clients, other tenants) that extra CPU is taken from them: the set then serves fewer
requests per second than one process would. So the supervisor samples the host and the
set once a second and parks processes while there is no spare core: a parked process
hands the connections it accepts to an active sibling and closes its own after their
current response (``server.http.handoff``); it goes back to work when a core is spare
again and the active processes are busy.

A set starts with one process active and takes the others as the rule finds cores for
them, rather than starting whole and parking: a process parked in the middle of a burst
has already routed the burst's first requests beside its sibling, and those split
starts cost hit rate that a set which never split does not lose.

This module is the rule alone (pure, no I/O): ``Parking.update`` takes one sample of CPU
seconds and returns how many processes should be active.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

WINDOW = 3  # samples (about a second each) a change is decided on, and held for at least
SPARE_CORE = 0.25  # idle cores under which the host has no spare core
OTHER_WORK = 0.5  # cores other work must take for the cores to count as shared (else the set alone fills them)
UNPARK_SPARE = 0.75  # idle cores a parked set needs before it takes one more process back
BUSY_PROCESS = 0.8  # cores an active process must use on average for one more to be worth it


@dataclass(frozen=True, slots=True)
class CoreSample:
    """CPU seconds over one interval: the whole host's busy time, and the set's serving processes'."""

    wall_s: float
    host_busy_s: float
    set_busy_s: float


class Parking:
    """The number of active processes, moved one at a time on a window of samples."""

    def __init__(self, count: int, cpus: int, *, window: int = WINDOW, active: int | None = None) -> None:
        self.count = count
        self.cpus = cpus
        self.active = count if active is None else max(1, min(count, active))
        self.window = window
        self._samples: deque[CoreSample] = deque(maxlen=window)

    def update(self, sample: CoreSample) -> int:
        """Take one sample; returns the active count (changed at most once per window)."""
        if sample.wall_s <= 0:
            return self.active
        self._samples.append(sample)
        if len(self._samples) < self.window:
            return self.active
        wall = sum(s.wall_s for s in self._samples)
        host = sum(s.host_busy_s for s in self._samples) / wall
        own = sum(s.set_busy_s for s in self._samples) / wall
        idle = max(0.0, self.cpus - host)
        other = max(0.0, host - own)
        if self.active > 1 and idle < SPARE_CORE and other >= OTHER_WORK:
            return self._move(-1)
        if self.active < self.count and idle >= UNPARK_SPARE and own / self.active >= BUSY_PROCESS:
            return self._move(+1)
        return self.active

    def _move(self, step: int) -> int:
        self.active += step
        self._samples.clear()  # the next change waits for a window measured in the new state
        return self.active
