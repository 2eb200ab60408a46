"""Run the official side (official_side.py) in a subprocess and talk to it.

A separate process because the official generated modules and token-gateway's
register the same .proto files in protobuf's default pool.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

SCRIPT = Path(__file__).resolve().parent / "official_side.py"


def run_official(command: str, payload: dict[str, Any], *, timeout: float = 60.0) -> dict[str, Any]:
    """Run one official-side command with `payload` as JSON input; return its JSON output."""
    result = subprocess.run(
        [sys.executable, str(SCRIPT), command],
        input=json.dumps(payload),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    if result.returncode != 0:
        raise RuntimeError(f"official side {command!r} failed:\n{result.stderr}")
    return json.loads(result.stdout)


@contextmanager
def official_server(log_path: Path, *, start_timeout: float = 20.0, command: str = "serve") -> Iterator[int]:
    """An official-stub servicer on 127.0.0.1 (SglangScheduler; ``command="serve-vllm"``:
    VllmEngine; ``"serve-trtllm"``: TrtllmService); yields its port."""
    process = subprocess.Popen(
        [sys.executable, str(SCRIPT), command, str(log_path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None
        line = _read_line(process, start_timeout)
        yield int(json.loads(line)["port"])
    finally:
        assert process.stdin is not None
        process.stdin.close()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)
        for pipe in (process.stdout, process.stderr):
            if pipe is not None:
                pipe.close()


def _read_line(process: subprocess.Popen[str], timeout: float) -> str:
    """The server's first stdout line, or the reason it never came."""
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.append(process.stdout.readline()), daemon=True)  # type: ignore[union-attr]
    reader.start()
    reader.join(timeout)
    if not lines or not lines[0].strip():
        process.kill()
        _, err = process.communicate(timeout=10)
        raise RuntimeError(f"official server did not start within {timeout}s:\n{err}")
    return lines[0]


def read_log(log_path: Path) -> list[dict[str, Any]]:
    """Every request the official server logged, in arrival order."""
    if not log_path.exists():
        return []
    return [json.loads(line) for line in log_path.read_text().splitlines() if line.strip()]
