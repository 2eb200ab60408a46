"""``serve --processes`` (server/process_config.py): how many serving processes, and the
CPUs each is pinned to."""

from __future__ import annotations

import os

import pytest

from gateway.server.process_config import ProcessConfig


def test_the_count_is_a_number_or_the_usable_cpus() -> None:
    assert ProcessConfig().count() == 1
    assert ProcessConfig(processes="4").count() == 4
    assert ProcessConfig(processes=" AUTO ").count() == len(os.sched_getaffinity(0))
    for bad in ("0", "-2"):
        with pytest.raises(ValueError, match="at least 1"):
            ProcessConfig(processes=bad).count()
    with pytest.raises(ValueError):
        ProcessConfig(processes="many").count()


def test_each_process_gets_an_equal_contiguous_share(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3, 4, 5, 6, 7})
    config = ProcessConfig()
    assert config.cpu_shares(2) == [{0, 1, 2, 3}, {4, 5, 6, 7}]
    assert config.cpu_shares(8) == [{i} for i in range(8)]
    assert config.cpu_shares(3) == [{0, 1}, {2, 3}, {4, 5}]  # the remainder stays unassigned


def test_no_pinning_when_off_alone_or_oversubscribed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {2, 3})
    assert ProcessConfig(process_cpu_affinity="off").cpu_shares(2) is None
    assert ProcessConfig().cpu_shares(1) is None
    assert ProcessConfig().cpu_shares(3) is None  # more processes than CPUs: the kernel balances
    assert ProcessConfig().cpu_shares(2) == [{2}, {3}]  # the CPUs this process may use, not 0..n
