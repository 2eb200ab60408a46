"""The machine a benchmark ran on (gateway_lab/bench/machine.py): its CPU model, a
process's CPU time, and the facts every figure is stored with."""

from __future__ import annotations

import os
import time

from gateway_lab.bench.machine import cpu_model, cpu_seconds, describe, facts


def test_a_process_cpu_time_grows_while_it_works() -> None:
    before = cpu_seconds(os.getpid())
    deadline = time.process_time() + 0.05
    while time.process_time() < deadline:  # bounded: 50 ms of CPU
        pass
    assert cpu_seconds(os.getpid()) > before
    assert cpu_seconds(2**22 + 12345) == 0.0  # no such process


def test_the_facts_name_the_machine() -> None:
    assert cpu_model() and cpu_model() != ""
    line = describe()
    assert line.startswith(f"{os.cpu_count()} CPUs, ") and "Python " in line
    f = facts()
    assert f["cpus"] == os.cpu_count() and f["date"].endswith("UTC") and len(f["load_avg"]) == 3
