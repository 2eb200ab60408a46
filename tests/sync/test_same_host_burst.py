"""A burst routed by the two processes of one ``serve --processes 2`` set, request by
request, through the real same-host sharing path (decision ring, prefill ring, bus
loads), against one process fed the same burst: the set must place each prompt group
on as few workers as one process does, not spill groups from their holders for load
that one process would not see.

The fleet model and the driver are ``burst_fleet``'s; here each process's ``Outbox`` is
applied by the other's ``Applier`` every few requests, and the decision ring and the
prefill ring live in one shared folder, polled before every choice as the router does.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from gateway.sync.apply import Applier
from gateway.sync.host_prefill import HostPrefill
from gateway.sync.host_ring import HostRing
from gateway.sync.outbox import Outbox
from tests.sync.burst_fleet import BUILDS, Build, Member, Placement, run_burst


async def _burst(processes: int, build: Build, run_dir: Path) -> Placement:
    members = [Member(build) for _ in range(processes)]
    appliers = []
    for i, m in enumerate(members):
        outbox = Outbox(f"p{i}", m.load, lambda wid: build.page, host_set="set")
        applier = Applier(f"p{i}", m.router, m.registry, host_set="set")  # type: ignore[arg-type]
        appliers.append(applier)
        if processes == 1:
            m.tap(outbox)
            continue
        ring = HostRing(run_dir, i, processes, applier.target)
        prefill = HostPrefill(run_dir, i, processes, on_sent=m.gate.add, on_done=m.gate.remove, on_queued=m.sibling_queued,
                              on_in_flight=m.sibling_in_flight)  # fmt: skip
        m.tap(outbox, ring, prefill)

    async def exchange() -> None:
        for m in members:
            assert m.outbox is not None
            batch = m.outbox.take()
            if batch is not None:
                for other, applier in zip(members, appliers, strict=True):
                    if other is not m:
                        applier.apply(batch)

    try:
        return await run_burst(members, exchange if processes > 1 else None)
    finally:
        for m in members:
            m.close()


@pytest.mark.parametrize("build", sorted(BUILDS))
async def test_a_set_of_two_places_a_burst_as_one_process_does(build: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from gateway.workers import worker as worker_module

    monkeypatch.setattr(worker_module, "time", SimpleNamespace(monotonic=lambda: 0.0))  # every poll is fresh: age 0
    (tmp_path / "one").mkdir()
    (tmp_path / "two").mkdir()
    one = await _burst(1, BUILDS[build], tmp_path / "one")
    two = await _burst(2, BUILDS[build], tmp_path / "two")
    assert one.spread <= 1.2  # the model routes a burst as the bench's one process does (1.1 workers a group)
    assert two.spread <= one.spread + 0.1, (one, two)
    # spills away from a known holder: as few as one process makes
    assert two.spills <= one.spills + 4, (one, two)
    # The prefill gate's free-slot check counts the siblings' requests on the worker from their
    # rings (sent, not ended), as fresh as one process's own: it says what the truth says at
    # every check, where the bus's late in-flight figure alone would not.
    assert all(gate == true for _, gate, true in two.gate_checks), (one, two)
    assert all(gate == true for _, gate, true in one.gate_checks), (one, two)
    wrong_by_bus = sum(n for (bus, _, true), n in two.gate_checks.items() if bus != true)
    print(f"build {build}: one {one}; two {two}; the bus alone would have been wrong at {wrong_by_bus} checks")
