"""Start and stop SGLang's own server (with the stand-in scheduler) and the gateway.

Used by the interop tests' fixtures and by the corpus runner. Runs in the
project's virtualenv; SGLang runs in its own (``.interop-venv``, built by
``scripts/interop/setup-sglang.sh``) as a child process, so neither set of
dependencies constrains the other. Every process gets a log file, a bounded
start wait, and is stopped with its whole process group.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
VENV = Path(os.environ.get("INTEROP_SGLANG_VENV", REPO / ".interop-venv"))
MODEL_DIR = Path(os.environ.get("INTEROP_SGLANG_MODEL_DIR", REPO / ".interop-model"))
STAMP = VENV / ".interop-stamp"
SERVED_MODEL = "Qwen3-8B-standin"
NOISE_RIDS = ("HEALTH_CHECK_", "smg-warmup", "WARMUP_")
READY_LINE = "The server is fired up and ready to roll!"


def unavailable_reason(*, require_opt_in: bool = False) -> str | None:
    """Why the interop environment is missing, or None when it is ready.

    With ``require_opt_in`` the suite also needs ``INTEROP_SGLANG=1`` (set by
    ``scripts/run-interop-sglang``), which keeps it out of the default test command.
    """
    if require_opt_in and os.environ.get("INTEROP_SGLANG") != "1":
        return "SGLang interop suite: run it with scripts/run-interop-sglang"
    if not (VENV / "bin" / "python").exists():
        return f"no interop virtualenv at {VENV.name}/ (run scripts/interop/setup-sglang.sh)"
    if not STAMP.exists():
        return f"{VENV.name}/ is incomplete (run scripts/interop/setup-sglang.sh)"
    if not (MODEL_DIR / "config.json").exists():
        return f"no model folder at {MODEL_DIR.name}/ (run scripts/interop/setup-sglang.sh)"
    return None


# SGLang derives more ports from --port (port + 1 for its HTTP sidecar, port + 10000 for a
# gRPC one), so ports come from a fixed low range, overridable for a shared machine.
PORT_BASE = int(os.environ.get("INTEROP_SGLANG_PORT_BASE", "34000"))
PORT_RANGE = range(PORT_BASE, PORT_BASE + 100)
# KV-event publishers' ports (a gateway binds them only when it starts): a range of their own,
# so no server started meanwhile takes them.
EVENT_PORTS = range(PORT_BASE + 100, PORT_BASE + 200)


def _is_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port(span: int = 1, ports: range = PORT_RANGE) -> int:
    """A free loopback port of ``ports`` whose next ``span - 1`` ports are free too."""
    candidates = list(ports)[: len(ports) - span]
    random.shuffle(candidates)
    for port in candidates:
        if all(_is_free(port + k) for k in range(span)):
            return port
    raise RuntimeError(f"no free port in {ports.start}-{ports.stop - 1} on 127.0.0.1")


@dataclass
class Recording:
    """The JSON lines the stand-in scheduler writes, one per request it receives.

    A mark is a byte offset, so reading what came after it never re-parses the
    earlier records (some hold prompts of 40,000 ids).
    """

    path: Path
    _offset: int = 0

    def _read_from(self, offset: int) -> list[dict[str, Any]]:
        if not self.path.exists():
            return []
        with self.path.open("rb") as f:
            f.seek(offset)
            data = f.read()
        complete = data[: data.rfind(b"\n") + 1]  # a line being written is read next time
        return [json.loads(line) for line in complete.splitlines() if line.strip()]

    def all(self) -> list[dict[str, Any]]:
        return self._read_from(0)

    def mark(self) -> None:
        """Later ``since_mark`` calls return only what arrives after this."""
        self._offset = self.path.stat().st_size if self.path.exists() else 0

    def since_mark(self, *, keep_noise: bool = False) -> list[dict[str, Any]]:
        new = self._read_from(self._offset)
        if keep_noise:
            return new
        return [r for r in new if not str(r["rid"]).startswith(NOISE_RIDS)]

    def generates(self) -> list[dict[str, Any]]:
        """The generate requests received since the mark (health checks and warm-up left out)."""
        return [r for r in self.since_mark() if r.get("kind") == "generate"]

    def aborts(self) -> list[dict[str, Any]]:
        return [r for r in self.since_mark() if r.get("kind") == "abort"]

    def wait(self, kind: str, count: int, timeout: float = 10.0) -> list[dict[str, Any]]:
        """At least ``count`` records of ``kind`` since the mark, or what came before the timeout."""
        deadline = time.monotonic() + timeout
        while True:
            got = [r for r in self.since_mark() if r.get("kind") == kind]
            if len(got) >= count or time.monotonic() > deadline:
                return got
            time.sleep(0.02)


@dataclass
class Process:
    """A child process in its own process group, with its log file."""

    popen: subprocess.Popen[bytes]
    log: Path
    extra: dict[str, Any] = field(default_factory=dict)

    def log_text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def stop(self) -> None:
        if self.popen.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.popen.pid, signal.SIGTERM)
            try:
                self.popen.wait(timeout=15)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.popen.pid, signal.SIGKILL)
                self.popen.wait(timeout=5)


def _spawn(argv: list[str], log: Path, env: dict[str, str]) -> Process:
    f = log.open("wb")
    popen = subprocess.Popen(argv, stdout=f, stderr=subprocess.STDOUT, env=env,
                             cwd=REPO, start_new_session=True)
    return Process(popen, log)


def _wait_for(proc: Process, done: Any, what: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.popen.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.popen.returncode}:\n{proc.log_text()[-4000:]}")
        if done():
            return
        time.sleep(0.2)
    proc.stop()
    raise RuntimeError(f"{what} not ready after {timeout:.0f} s:\n{proc.log_text()[-4000:]}")


# What SGLang prints when its port was taken between our check and its bind (the gRPC
# server's bind, or uvicorn's).
_PORT_TAKEN = ("Failed to bind to address", "address already in use")


def start_sglang(workdir: Path, *, grpc: bool, port: int | None = None,
                 extra_args: list[str] | None = None, step_ms: float = 2.0,
                 timeout: float = 240.0, tries: int = 3) -> Process:
    """SGLang's own server, ``--grpc-mode`` or HTTP, in front of the stand-in scheduler.

    A port picked here is free when picked and bound by SGLang seconds later; the range
    lies in the kernel's ephemeral range, so any outgoing connection on the host may take
    it meanwhile. A server that fails to bind its port is started again on another one."""
    if port is not None:
        return _start_sglang_on(workdir, grpc=grpc, port=port, extra_args=extra_args, step_ms=step_ms, timeout=timeout)
    for attempt in range(1, tries + 1):
        try:
            return _start_sglang_on(workdir, grpc=grpc, port=free_port(span=3), extra_args=extra_args,
                                    step_ms=step_ms, timeout=timeout)
        except RuntimeError as exc:
            if attempt == tries or not any(sign in str(exc) for sign in _PORT_TAKEN):
                raise
    raise AssertionError("unreachable")


def _start_sglang_on(workdir: Path, *, grpc: bool, port: int, extra_args: list[str] | None,
                     step_ms: float, timeout: float) -> Process:
    record = workdir / f"scheduler-{'grpc' if grpc else 'http'}-{port}.jsonl"
    env = dict(os.environ)
    env.update({
        "PYTHONPATH": str(REPO),
        "INTEROP_SGLANG_RECORD": str(record),
        "INTEROP_SGLANG_STEP_MS": str(step_ms),
        "SGLANG_HEALTH_CHECK_TIMEOUT": "20",
    })
    argv = [str(VENV / "bin" / "python"), "-m", "tests.interop_sglang.standin.launch",
            "--model-path", str(MODEL_DIR), "--served-model-name", SERVED_MODEL,
            "--device", "cpu", "--host", "127.0.0.1", "--port", str(port),
            *(["--grpc-mode"] if grpc else []), *(extra_args or [])]
    proc = _spawn(argv, workdir / f"sglang-{'grpc' if grpc else 'http'}-{port}.log", env)
    _wait_for(proc, lambda: READY_LINE in proc.log_text(), "SGLang's server", timeout)
    proc.extra.update(port=port, recording=Recording(record),
                      url=(f"grpc://127.0.0.1:{port}" if grpc else f"http://127.0.0.1:{port}"))
    return proc


def start_gateway(workdir: Path, worker_url: str, *, extra_args: list[str] | None = None,
                  timeout: float = 60.0) -> Process:
    """``token-gateway serve`` in front of one worker; its URL is read from its ready line."""
    exe = Path(sys.executable).with_name("token-gateway")
    argv = [str(exe), "serve", "--worker-urls", worker_url, "--port", "0",
            "--host", "127.0.0.1", *(extra_args or [])]
    env = {k: v for k, v in os.environ.items() if not k.startswith("TOKEN_GATEWAY_")}
    proc = _spawn(argv, workdir / "gateway.log", env)

    def ready() -> bool:
        for line in proc.log_text().splitlines():
            if line.startswith("{") and '"event":"ready"' in line.replace(" ", ""):
                proc.extra["url"] = json.loads(line)["url"]
                return True
        return False

    _wait_for(proc, ready, "token-gateway serve", timeout)
    return proc


def wait_for_model(gateway: Process, timeout: float = 180.0) -> None:
    """Until the gateway serves ``SERVED_MODEL`` (a worker that answered its first probe
    late is added by the gateway's background retries)."""
    import httpx

    def listed() -> bool:
        try:
            reply = httpx.get(gateway.extra["url"] + "/v1/models", timeout=5)
        except httpx.HTTPError:
            return False
        return reply.status_code == 200 and any(m.get("id") == SERVED_MODEL for m in reply.json().get("data", []))

    _wait_for(gateway, listed, "the gateway's worker", timeout)


@contextlib.contextmanager
def running(proc: Process) -> Iterator[Process]:
    try:
        yield proc
    finally:
        proc.stop()
