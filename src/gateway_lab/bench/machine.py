"""What machine a benchmark ran on, and how much CPU a process used: every figure
in docs/BENCHMARKS.md names its machine, and CPU time is steadier than wall time
on a shared host."""

from __future__ import annotations

import os
import platform
import time
from pathlib import Path
from typing import Any


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of process ``pid`` (Linux /proc; 0 elsewhere)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return 0.0


def describe() -> str:
    """One line: cores, CPU model, Python, date."""
    return f"{os.cpu_count()} CPUs, {cpu_model()}, Python {platform.python_version()}, {time.strftime('%Y-%m-%d')}"


def facts() -> dict[str, Any]:
    return {
        "cpus": os.cpu_count(),
        "cpu_model": cpu_model(),
        "python": platform.python_version(),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "load_avg": os.getloadavg(),
    }
