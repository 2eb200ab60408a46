"""Start and stop vLLM's own servers (over the stand-in engine core) for the interop tests.

vLLM runs in its own virtualenv (``.interop-vllm-venv``, built by
``scripts/interop/setup-vllm.sh``) as a child process; the gateway and the process
plumbing (log file, bounded start wait, whole-group stop) are the SGLang suite's.
"""

from __future__ import annotations

import json
import os
import random
import socket
from pathlib import Path

from tests.interop_sglang.servers import MODEL_DIR, REPO, Process, Recording, _spawn, _wait_for

VENV = Path(os.environ.get("INTEROP_VLLM_VENV", REPO / ".interop-vllm-venv"))
STAMP = VENV / ".interop-stamp"
SERVED_MODEL = "Qwen3-8B-standin"
# What vLLM's two launchers print once they serve.
READY = {"http": "Application startup complete.", "grpc": "Server is ready to accept requests"}
# A gateway's start (imports, tokenizer, first probes) beside two vLLM servers took over a
# minute on a loaded two-core host.
GATEWAY_START_S = 180.0
PORT_BASE = int(os.environ.get("INTEROP_VLLM_PORT_BASE", "42500"))
PORTS = range(PORT_BASE, PORT_BASE + 100)
# The data-parallel servers' KV-event publishers (rank N at the base + N), which the gateway
# binds only when it starts: a range of their own, so no server takes them in the meantime.
EVENT_PORTS = range(PORT_BASE + 100, PORT_BASE + 200)


def unavailable_reason(*, require_opt_in: bool = False) -> str | None:
    """Why the interop environment is missing, or None when it is ready; with
    ``require_opt_in`` the suite also needs ``INTEROP_VLLM=1`` (``scripts/run-interop-vllm``)."""
    if require_opt_in and os.environ.get("INTEROP_VLLM") != "1":
        return "vLLM interop suite: run it with scripts/run-interop-vllm"
    if not (VENV / "bin" / "python").exists() or not STAMP.exists():
        return f"no complete interop virtualenv at {VENV.name}/ (run scripts/interop/setup-vllm.sh)"
    if not (MODEL_DIR / "config.json").exists():
        return f"no model folder at {MODEL_DIR.name}/ (run scripts/interop/setup-vllm.sh)"
    return None


def free_port(count: int = 1, ports: range = PORTS) -> int:
    """A loopback port P of ``ports`` with P .. P + count - 1 all free now."""
    candidates = list(ports)[: len(ports) - count + 1]
    random.shuffle(candidates)
    for port in candidates:
        if all(_free(p) for p in range(port, port + count)):
            return port
    raise RuntimeError(f"no {count} free port(s) in {ports.start}-{ports.stop - 1} on 127.0.0.1")


def _free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


# What vLLM prints when its port was taken between our check and its bind (gRPC's, uvicorn's).
_PORT_TAKEN = ("failed to bind to address", "address already in use")  # compared in lower case


def start_vllm(
    workdir: Path,
    *,
    transport: str,
    step_ms: float = 2.0,
    extra_args: list[str] | None = None,
    timeout: float = 300.0,
    tries: int = 3,
) -> Process:
    """vLLM's OpenAI server (``transport="http"``) or its ``--grpc`` servicer over the stand-in.

    The port range lies in the kernel's ephemeral range, so an outgoing connection may take a
    port between the check and vLLM's bind: such a start is tried again on another port."""
    for attempt in range(1, tries + 1):
        try:
            return _start_on(
                workdir,
                free_port(),
                transport=transport,
                step_ms=step_ms,
                extra_args=extra_args,
                timeout=timeout,
            )
        except RuntimeError as exc:
            if attempt == tries or not any(sign in str(exc).lower() for sign in _PORT_TAKEN):
                raise
    raise AssertionError("unreachable")


def _start_on(
    workdir: Path,
    port: int,
    *,
    transport: str,
    step_ms: float,
    extra_args: list[str] | None,
    timeout: float,
) -> Process:
    record = workdir / f"core-{transport}-{port}.jsonl"
    data_parallel = "--data-parallel-size" in (extra_args or [])
    env = dict(os.environ)
    env.update(
        {
            "PYTHONPATH": str(REPO),
            "INTEROP_VLLM_RECORD": str(record),
            "INTEROP_VLLM_STEP_MS": str(step_ms),
            "VLLM_TARGET_DEVICE": "cpu",
            "VLLM_NO_USAGE_STATS": "1",
            "VLLM_SERVER_DEV_MODE": "1",  # /reset_prefix_cache, the route the gateway's flush calls
        }
    )
    events_port = 0
    if data_parallel:
        # vLLM gives each data-parallel engine its own publisher at the endpoint's port plus
        # its rank (an ipc endpoint it refuses above rank 0). An endpoint with an address is
        # connected to by vLLM's publisher (a wildcard one it would bind on every interface):
        # the gateway binds 127.0.0.1 at those ports (``--kv-events-zmq``), both transports.
        events_port = free_port(2, EVENT_PORTS)
        extra_args = [
            "--kv-events-config",
            json.dumps({"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": f"tcp://127.0.0.1:{events_port}"}),
            *(extra_args or []),
        ]
    elif transport == "http" and "--runner" not in (extra_args or []):
        # vLLM's own publisher, found by the gateway in the development-mode /server_info
        # (``--kv-events-zmq auto``): vLLM connects out to an address, which the gateway binds,
        # and binds its replay socket on 127.0.0.1, so nothing listens beyond loopback.
        events_port = free_port(2, EVENT_PORTS)
        config = {
            "enable_kv_cache_events": True,
            "publisher": "zmq",
            "endpoint": f"tcp://127.0.0.1:{events_port}",
            "replay_endpoint": f"tcp://127.0.0.1:{events_port + 1}",
        }
        extra_args = ["--kv-events-config", json.dumps(config), *(extra_args or [])]
    elif transport == "grpc":
        # The servicer relays KV events (rank 0's): the stand-in publishes them through vLLM's
        # own ZMQ publisher, which binds a wildcard or an ipc endpoint; an ipc socket in the
        # work folder keeps it off the network.
        events = '{"enable_kv_cache_events": true, "publisher": "zmq", "endpoint": "ipc://%s"}'
        extra_args = ["--kv-events-config", events % (workdir / f"kv-{port}.ipc"), *(extra_args or [])]
    argv = [
        str(VENV / "bin" / "python"),
        "-m",
        "tests.interop_vllm.standin.launch",
        *(["--grpc"] if transport == "grpc" else ["--enable-prompt-tokens-details"]),
        "--model",
        str(MODEL_DIR),
        "--served-model-name",
        SERVED_MODEL,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        *(extra_args or []),
    ]
    proc = _spawn(argv, workdir / f"vllm-{transport}-{port}.log", env)
    _wait_for(
        proc, lambda: READY[transport] in proc.log_text(), f"vLLM's {transport} server", timeout
    )
    scheme = "grpc" if transport == "grpc" else "http"
    proc.extra.update(port=port, recording=Recording(record), url=f"{scheme}://127.0.0.1:{port}")
    if events_port:
        proc.extra["kv_events"] = f"tcp://127.0.0.1:{events_port}"
        if not data_parallel:
            proc.extra["kv_replay"] = f"tcp://127.0.0.1:{events_port + 1}"
    return proc
