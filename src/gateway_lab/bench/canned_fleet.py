"""Zero-cost stand-in workers for throughput benchmarks: nginx serving canned gRPC replies.

Why: on a small machine the benchmark's workers share the gateway's cores, and a Python
grpc.aio worker costs a large share of the gateway's own CPU per call, so a scale-out
benchmark with simulated workers measures the simulator as much as the gateway. The GPU
workers of a real fleet never run on the gateway's host. nginx (C, one event loop,
plaintext HTTP/2 with prior knowledge) answers a gRPC call from a file for a small
fraction of that, which is as close to "zero-cost workers" as a real
process on loopback gets.

What it answers, per worker (one nginx ``server`` per port, one nginx process for all):

* ``GetModelInfo``, ``GetServerInfo``, ``HealthCheck``, ``GetLoads``, ``Abort``,
  ``FlushCache``, ``GetTokenizer``: the replies a simulated worker with the same settings
  gives (an idle worker: no load, nothing to abort);
* ``Generate``: one ``GenerateComplete`` with the canned output ids, finish ``length``,
  for streaming and non-streaming requests alike (nginx cannot read the request's
  ``stream`` flag; the gateway takes a lone complete as the whole output either way, so
  a streamed request gets its tokens in one chunk). ``prompt_tokens`` is 0 unless set
  (:meth:`CannedFleet.set_prompt_tokens`): a worker that does not report the count, which
  the gateway's tokenizer-fidelity guard takes as no evidence either way;
* any other method (``Embed``, ``SubscribeKvEvents``): ``UNIMPLEMENTED``.

nginx cannot serve a POST from a static file (405); ``error_page 405 =200 $uri``
re-runs the request as a GET of the same path with status 200, the known workaround.
The replies are length-prefixed protobuf bodies built from the project's own proto
classes when the fleet starts; ``grpc-status`` goes in an HTTP/2 trailer
(``add_trailer ... always``). Everything lives in a temporary directory made at start.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from google.protobuf import struct_pb2
from google.protobuf.message import Message

from gateway.proto import common_pb2
from gateway.proto import sglang_scheduler_pb2 as pb
from gateway_lab.bench.ports import free_ports
from gateway_lab.sim.vocab import load_vocab, tokenizer_zip

SERVICE = "sglang.grpc.scheduler.SglangScheduler"
TOKENIZER_CHUNK_BYTES = 1 << 20
NGINX_PACKAGE = "nginx-light"
FILE_CACHE_VALID_S = 1
CANNED_TEXT = (
    " a canned reply from a zero-cost stand-in worker, the same for every request of the benchmark"
)


def grpc_frame(message: Message) -> bytes:
    """One gRPC length-prefixed message (uncompressed)."""
    body = message.SerializeToString()
    return b"\x00" + len(body).to_bytes(4, "big") + body


def find_nginx() -> str | None:
    """The nginx binary (PATH, then Debian's /usr/sbin), or None."""
    return shutil.which("nginx") or shutil.which("nginx", path="/usr/sbin:/usr/local/sbin")


def ensure_nginx() -> str:
    """nginx's path, installing Debian's ``nginx-light`` when missing and we are root."""
    found = find_nginx()
    if found:
        return found
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        raise RuntimeError(f"nginx not found: install it (apt-get install -y {NGINX_PACKAGE})")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    subprocess.run(
        ["apt-get", "install", "-y", "-q", NGINX_PACKAGE], check=False, env=env, capture_output=True
    )
    if not find_nginx():
        subprocess.run(["apt-get", "update", "-q"], check=False, env=env, capture_output=True)
        subprocess.run(
            ["apt-get", "install", "-y", "-q", NGINX_PACKAGE],
            check=True,
            env=env,
            capture_output=True,
        )
    found = find_nginx()
    if not found:
        raise RuntimeError(f"apt-get install {NGINX_PACKAGE} did not provide nginx")
    return found


class CannedFleet:
    """``n`` zero-cost stand-in workers on loopback, all served by one nginx process.

    Use as a context manager; ``urls`` are the workers' URLs (``grpc://host:port``), ``pid``
    nginx's process id (for CPU accounting: nginx runs as one process, no master).
    """

    def __init__(
        self,
        n: int,
        *,
        output_tokens: int = 8,
        model: str = "qwen3-sim",
        page_size: int = 16,
        kv_capacity_tokens: int = 65536,
        max_running_requests: int = 256,
        context_length: int = 32768,
        tokenizer_path: str = "",
        ready_timeout_s: float = 10.0,
    ) -> None:
        self.n = n
        self.output_tokens = output_tokens
        self.model = model
        self.page_size = page_size
        self.kv_capacity_tokens = kv_capacity_tokens
        self.max_running_requests = max_running_requests
        self.context_length = context_length
        self.tokenizer_path = tokenizer_path
        self.ready_timeout_s = ready_timeout_s
        self.ports: list[int] = []
        self.proc: subprocess.Popen[bytes] | None = None
        self.prompt_tokens = 0
        self._dir: tempfile.TemporaryDirectory[str] | None = None
        self._vocab = load_vocab(tokenizer_path)
        self.output_ids = self._pick_output_ids(output_tokens)

    # ------------------------------------------------------------ replies

    def _pick_output_ids(self, count: int) -> list[int]:
        """Ordinary word tokens (never EOS or special), so the gateway detokenizes real text."""
        ids = self._vocab.encode(CANNED_TEXT)
        return [ids[i % len(ids)] for i in range(count)]

    def generate_reply(self) -> bytes:
        done = pb.GenerateComplete(
            output_ids=self.output_ids, finish_reason="length", prompt_tokens=self.prompt_tokens,
            completion_tokens=len(self.output_ids), cached_tokens=0,
        )  # fmt: skip
        return grpc_frame(pb.GenerateResponse(request_id="canned", complete=done))

    def replies(self, port: int) -> dict[str, bytes]:
        """Method name -> the reply body of the worker on ``port``."""
        vocab = self._vocab
        server_args = struct_pb2.Struct()
        server_args.update({
            "model_path": self.model, "served_model_name": self.model, "tokenizer_path": str(vocab.path),
            "page_size": self.page_size, "max_running_requests": self.max_running_requests,
            "chunked_prefill_size": 8192, "context_length": self.context_length,
            "max_total_tokens": self.kv_capacity_tokens, "disaggregation_mode": "null",
            "skip_tokenizer_init": True, "grpc_mode": True, "host": "127.0.0.1", "port": port,
            "dp_size": 1, "tp_size": 1, "simulated": True,
        })  # fmt: skip
        scheduler_info = struct_pb2.Struct()
        scheduler_info.update({
            "max_total_num_tokens": self.kv_capacity_tokens, "max_running_requests": self.max_running_requests,
            "page_size": self.page_size, "chunked_prefill_size": 8192,
        })  # fmt: skip
        load = pb.SchedulerLoad(
            dp_rank=0, max_total_num_tokens=self.kv_capacity_tokens, max_running_requests=self.max_running_requests,
            memory=pb.MemoryMetrics(token_capacity=self.kv_capacity_tokens), queues=pb.QueueMetrics(),
        )  # fmt: skip
        data, digest = tokenizer_zip(vocab.path)
        chunks = b"".join(
            grpc_frame(
                common_pb2.GetTokenizerChunk(
                    data=data[i : i + TOKENIZER_CHUNK_BYTES],
                    sha256=digest if i + TOKENIZER_CHUNK_BYTES >= len(data) else "",
                )
            )
            for i in range(0, len(data), TOKENIZER_CHUNK_BYTES)
        )
        return {
            "Generate": self.generate_reply(),
            "HealthCheck": grpc_frame(pb.HealthCheckResponse(healthy=True, message="ok")),
            "Abort": grpc_frame(
                pb.AbortResponse(success=False, message="canned worker: nothing in flight")
            ),
            "GetModelInfo": grpc_frame(
                pb.GetModelInfoResponse(
                    model_path=self.model,
                    tokenizer_path=str(vocab.path),
                    is_generation=True,
                    weight_version="default",
                    served_model_name=self.model,
                    max_context_length=self.context_length,
                    vocab_size=vocab.vocab_size,
                    model_type="qwen3",
                    eos_token_ids=list(vocab.eos_ids),
                    pad_token_id=vocab.pad_id or 0,
                    bos_token_id=vocab.bos_id or 0,
                    max_req_input_len=self.context_length - 1,
                    architectures=["CannedForCausalLM"],
                )
            ),
            "GetServerInfo": grpc_frame(
                pb.GetServerInfoResponse(
                    server_args=server_args,
                    scheduler_info=scheduler_info,
                    sglang_version="canned",
                    server_type="grpc",
                    max_total_num_tokens=self.kv_capacity_tokens,
                )
            ),
            "GetLoads": grpc_frame(
                pb.GetLoadsResponse(
                    version="canned",
                    dp_rank_count=1,
                    loads=[load],
                    aggregate=pb.AggregateMetrics(),
                )
            ),
            "FlushCache": grpc_frame(
                common_pb2.FlushCacheResponse(success=True, message="canned worker: nothing cached")
            ),
            "GetTokenizer": chunks,
        }

    # ------------------------------------------------------------ nginx

    def config(self, root: Path) -> str:
        """nginx.conf: one process, no master, no logs but errors, one server per worker."""
        servers = "\n".join(
            f"""
    server {{
        listen 127.0.0.1:{port} http2 reuseport;
        root {root}/w{i};
        location /{SERVICE}/ {{
            error_page 405 =200 $uri;
            add_trailer grpc-status 0 always;
            add_trailer grpc-message "" always;
        }}
        location / {{
            add_header grpc-status 12 always;
            add_header grpc-message "not served by the canned worker" always;
            return 200;
        }}
    }}"""
            for i, port in enumerate(self.ports)
        )
        temp = "\n".join(
            f"    {k}_temp_path {root}/tmp_{k};"
            for k in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi")
        )
        return f"""
daemon off;
master_process off;
worker_processes 1;
pid {root}/nginx.pid;
error_log {root}/error.log warn;
events {{
    worker_connections 8192;
}}
http {{
    access_log off;
    types {{ }}
    default_type application/grpc;
    etag off;
    server_tokens off;
    keepalive_requests 100000000;
    keepalive_timeout 3600s;
    http2_max_concurrent_streams 1024;
    client_max_body_size 256m;
    client_body_buffer_size 1m;
    open_file_cache max=64 inactive=3600s;
    open_file_cache_valid {FILE_CACHE_VALID_S}s;
{temp}
{servers}
}}
"""

    def _write_replies(self, root: Path) -> None:
        for i, port in enumerate(self.ports):
            d = root / f"w{i}" / SERVICE
            d.mkdir(parents=True, exist_ok=True)
            for method, body in self.replies(port).items():
                (d / method).write_bytes(body)

    def set_prompt_tokens(self, n: int) -> None:
        """Report ``n`` prompt tokens in every later ``Generate`` reply (0: not reported).

        The reply files are replaced atomically and nginx's file cache revalidates them
        within ``FILE_CACHE_VALID_S``, which this waits out: it is for set-up, before a
        measurement.
        """
        self.prompt_tokens = n
        if self._dir is None:
            return
        root = Path(self._dir.name)
        body = self.generate_reply()
        for i in range(len(self.ports)):
            path = root / f"w{i}" / SERVICE / "Generate"
            tmp = path.with_suffix(".tmp")
            tmp.write_bytes(body)
            tmp.replace(path)
        time.sleep(FILE_CACHE_VALID_S + 0.2)  # nginx re-checks its cached file within this

    @property
    def urls(self) -> list[str]:
        """Worker URLs as ``serve --worker-urls`` takes them."""
        return [f"grpc://127.0.0.1:{p}" for p in self.ports]

    @property
    def addresses(self) -> list[str]:
        """``host:port`` of each worker, as a gRPC channel takes them."""
        return [f"127.0.0.1:{p}" for p in self.ports]

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def start(self) -> CannedFleet:
        nginx = ensure_nginx()
        self._nginx = nginx
        self._dir = tempfile.TemporaryDirectory(prefix="canned-fleet-")
        root = Path(self._dir.name)
        for attempt in range(3):
            self.ports = free_ports(self.n)
            self._write_replies(root)
            (root / "nginx.conf").write_text(self.config(root))
            try:
                self._spawn()
                return self
            except RuntimeError:
                self._stop_proc()
                if attempt == 2:
                    self.stop()
                    raise
        return self

    def _spawn(self) -> None:
        assert self._dir is not None
        root = Path(self._dir.name)
        self.proc = subprocess.Popen(
            [self._nginx, "-p", str(root), "-c", str(root / "nginx.conf")],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True,
        )  # fmt: skip
        deadline = time.monotonic() + self.ready_timeout_s
        pending = set(self.ports)
        while pending and time.monotonic() < deadline:
            if self.proc.poll() is not None:
                err = self.proc.stderr.read().decode(errors="replace") if self.proc.stderr else ""
                raise RuntimeError(f"nginx exited ({self.proc.returncode}): {err[-2000:]}")
            for port in list(pending):
                with (
                    contextlib.suppress(OSError),
                    socket.create_connection(("127.0.0.1", port), timeout=0.2),
                ):
                    pending.discard(port)
            if pending:
                time.sleep(0.02)
        if pending:
            raise RuntimeError(
                f"nginx did not listen on {sorted(pending)} within {self.ready_timeout_s}s"
            )

    def _stop_proc(self) -> None:
        proc, self.proc = self.proc, None
        if proc is None:
            return
        if proc.poll() is None:
            proc.send_signal(signal.SIGQUIT)  # graceful: finish the calls in flight
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
        if proc.stderr is not None:
            proc.stderr.close()

    def stop(self) -> None:
        self._stop_proc()
        if self._dir is not None:
            self._dir.cleanup()
            self._dir = None

    def __enter__(self) -> CannedFleet:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()
