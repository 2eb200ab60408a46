"""Peer gateways from PyPI (``smg``, the Rust SGLang model gateway) as child processes.

``scripts/peers.sh`` installs them into their own virtualenv. A peer is started in
front of the same simulated gRPC workers as ours (``grpc://`` worker URLs, the Qwen3
tokenizer files for its tokenizer), is ready once ``GET /v1/models`` lists a model,
and is stopped like ``ServeProcess`` (SIGTERM to its process group, then SIGKILL).
"""

from __future__ import annotations

import asyncio
import contextlib
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import IO

import httpx

from gateway_lab.bench.ports import free_ports
from gateway_lab.bench.serve_process import _LIVE, _log_tail, _terminate

# peer name -> python module run with ``-m``
PEER_MODULES = {"smg": "smg"}
# our policies the peer has under the same name
PEER_POLICIES = ("cache_aware", "round_robin", "random", "power_of_two", "prefix_hash")


def peer_argv(
    python: str, peer: str, worker_urls: Sequence[str], policy: str, tokenizer_dir: str, port: int, metrics_port: int
) -> list[str]:
    """The command line of ``peer`` routing with ``policy`` over ``worker_urls``."""
    if peer not in PEER_MODULES:
        raise ValueError(f"unknown peer {peer!r}; known: {', '.join(PEER_MODULES)}")
    if policy not in PEER_POLICIES:
        raise ValueError(f"policy {policy!r} has no peer equivalent; choose from {', '.join(PEER_POLICIES)}")
    return [
        python, "-m", PEER_MODULES[peer], "launch",
        "--host", "127.0.0.1", "--port", str(port),
        "--worker-urls", *worker_urls,
        "--policy", policy,
        "--tokenizer-path", tokenizer_dir, "--model-path", tokenizer_dir,
        "--prometheus-host", "127.0.0.1", "--prometheus-port", str(metrics_port),
        "--log-level", "warn",
    ]  # fmt: skip


class PeerProcess:
    """One peer gateway child process."""

    def __init__(self, process: asyncio.subprocess.Process, url: str, log_path: Path) -> None:
        self.process = process
        self.url = url
        self.log_path = log_path

    @classmethod
    async def start(
        cls,
        python: str,
        peer: str,
        worker_urls: Sequence[str],
        policy: str,
        tokenizer_dir: str,
        *,
        ready_timeout_s: float = 60.0,
    ) -> PeerProcess:
        port, metrics_port = free_ports(2)
        argv = peer_argv(python, peer, worker_urls, policy, tokenizer_dir, port, metrics_port)
        log_file: IO[bytes] = tempfile.NamedTemporaryFile(prefix=f"peer-{peer}-", suffix=".log", delete=False)
        try:
            process = await asyncio.create_subprocess_exec(
                *argv, stdin=asyncio.subprocess.DEVNULL, stdout=log_file, stderr=log_file,
                start_new_session=True,
            )  # fmt: skip
        finally:
            log_file.close()
        _LIVE.add(process.pid)
        peer_process = cls(process, f"http://127.0.0.1:{port}", Path(log_file.name))
        try:
            await peer_process.wait_ready(time.monotonic() + ready_timeout_s)
        except BaseException:
            await peer_process.stop()
            raise
        return peer_process

    async def wait_ready(self, deadline: float) -> None:
        """Ready once ``/v1/models`` names a model and a one-token completion succeeds.

        (The peer registers workers and loads its tokenizer in the background; until
        then it answers 503.) The probe's prompt is shorter than a KV page, so it leaves
        nothing in any worker's cache that a benchmark prompt could hit.
        """
        model = ""
        async with httpx.AsyncClient(trust_env=False, timeout=5.0) as client:
            while True:
                if self.process.returncode is not None:
                    raise RuntimeError(
                        f"peer exited (code {self.process.returncode}); log {self.log_path}:\n"
                        f"{_log_tail(self.log_path)}"
                    )
                with contextlib.suppress(httpx.HTTPError, ValueError, KeyError, IndexError):
                    if not model:
                        response = await client.get(self.url + "/v1/models")
                        if response.status_code == 200:
                            model = str(response.json()["data"][0]["id"])
                    if model:
                        body = {"model": model, "prompt": " hi", "max_tokens": 1}
                        response = await client.post(self.url + "/v1/completions", json=body)
                        if response.status_code == 200:
                            return
                if time.monotonic() > deadline:
                    raise RuntimeError(f"peer at {self.url} never became ready; log {self.log_path}")
                await asyncio.sleep(0.2)

    async def stop(self, timeout_s: float = 5.0) -> int | None:
        await _terminate(self.process, timeout_s)
        return self.process.returncode

    def remove_log(self) -> None:
        with contextlib.suppress(OSError):
            self.log_path.unlink()
