#!/usr/bin/env python
"""What one extra process hop costs on this machine with no work at all: the floor under
the gateway's added latency.

    token-gateway bench hop-floor --calls 400

One zero-cost simulated worker in a child process and nginx with ``grpc_pass`` in front
of it (HTTP/2 in, HTTP/2 out, a kept-alive upstream connection, no logging: a proxy that
does nothing but forward frames, in C). This process calls the worker's ``Generate`` with
grpcio's synchronous stub, the gateway benchmark's cheapest direct caller (32 prompt ids,
8 output tokens, not streamed, the same request as the latency goal's), alternately
straight and through nginx, one call at a time. Printed: p50/p99 of each, the difference
(what the hop adds) and nginx's CPU per call from ``/proc``. nginx comes from Debian
(``nginx-light`` has the gRPC proxy module); without it the script says so and stops.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from gateway_lab.bench import launch, ports

NGINX_CONF = """
daemon off;
master_process off;
worker_processes 1;
pid {root}/nginx.pid;
error_log {root}/error.log warn;
events {{ worker_connections 64; }}
http {{
    access_log off;
    client_body_temp_path {root}/body;
    proxy_temp_path {root}/proxy;
    fastcgi_temp_path {root}/fastcgi;
    uwsgi_temp_path {root}/uwsgi;
    scgi_temp_path {root}/scgi;
    upstream worker {{
        server {worker};
        keepalive 4;
    }}
    server {{
        listen 127.0.0.1:{port} http2;
        location / {{
            grpc_pass grpc://worker;
        }}
    }}
}}
"""


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def wait_port(port: int, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise TimeoutError(f"nothing listens on 127.0.0.1:{port}")


def measure(worker: str, args: argparse.Namespace, nginx: str) -> dict[str, Any]:
    import grpc

    from gateway.proto import sglang_scheduler_pb2 as pb
    from gateway.proto import sglang_scheduler_pb2_grpc as pb_grpc

    root = Path(tempfile.mkdtemp(prefix="hop-floor-"))
    port = ports.free_port()
    (root / "nginx.conf").write_text(NGINX_CONF.format(root=root, worker=worker, port=port))
    proc = subprocess.Popen([nginx, "-p", str(root), "-c", str(root / "nginx.conf"), "-e", str(root / "error.log")])
    try:
        wait_port(port)
        direct_ch = grpc.insecure_channel(worker)
        proxy_ch = grpc.insecure_channel(f"127.0.0.1:{port}")
        stubs = {"direct": pb_grpc.SglangSchedulerStub(direct_ch), "nginx": pb_grpc.SglangSchedulerStub(proxy_ch)}
        ids = list(range(1000, 1000 + args.prompt_tokens))

        def call(stub: Any) -> float:
            request = pb.GenerateRequest(
                request_id=uuid.uuid4().hex, tokenized=pb.TokenizedInput(input_ids=ids),
                sampling_params=pb.SamplingParams(temperature=0.0, n=1, max_new_tokens=args.max_tokens, ignore_eos=True),
                stream=False,
            )  # fmt: skip
            t0 = time.perf_counter()
            for _ in stub.Generate(request, timeout=30):
                pass
            return time.perf_counter() - t0

        for _ in range(20):  # warm: connections (nginx's upstream one too)
            for stub in stubs.values():
                call(stub)
        times: dict[str, list[float]] = {"direct": [], "nginx": []}
        c0 = cpu_s(proc.pid)
        deadline = time.perf_counter() + args.cap_s
        for i in range(args.calls):
            if time.perf_counter() > deadline:
                break
            order = ("direct", "nginx") if i % 2 == 0 else ("nginx", "direct")  # neither always meets a warmer machine
            for name in order:
                times[name].append(call(stubs[name]) * 1e3)
        cpu = cpu_s(proc.pid) - c0
        direct_ch.close()
        proxy_ch.close()
    finally:
        proc.terminate()
        proc.wait(10)
        shutil.rmtree(root, ignore_errors=True)
    d, n = times["direct"], times["nginx"]
    return {
        "calls": len(d), "direct_p50_ms": round(pct(d, 0.5), 3), "nginx_p50_ms": round(pct(n, 0.5), 3),
        "added_p50_ms": round(pct(n, 0.5) - pct(d, 0.5), 3), "direct_p99_ms": round(pct(d, 0.99), 3),
        "nginx_p99_ms": round(pct(n, 0.99), 3), "added_p99_ms": round(pct(n, 0.99) - pct(d, 0.99), 3),
        "nginx_cpu_us_per_call": round(1e6 * cpu / max(1, len(n)), 1), "load_1min": round(os.getloadavg()[0], 2),
    }  # fmt: skip


async def _measure_on_a_fleet(args: argparse.Namespace) -> dict[str, Any]:
    """Both legs against one zero-cost worker started by the launcher; the calls are
    synchronous (grpcio's blocking stub), so they run off the event loop."""
    async with launch.fleet("process", 1, launch.ZERO_COST) as fleet:
        return await asyncio.to_thread(measure, fleet.urls[0].removeprefix("grpc://"), args, args.nginx)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The scenario's flags (``token-gateway bench NAME --help``)."""
    parser.add_argument("--calls", type=int, default=400, help="calls each way (bounded by --cap-s)")
    parser.add_argument("--cap-s", type=float, default=60.0)
    parser.add_argument("--prompt-tokens", type=int, default=32)
    parser.add_argument("--max-tokens", type=int, default=8)
    parser.add_argument("--nginx", default=shutil.which("nginx") or "/usr/sbin/nginx")
    parser.add_argument("--json", type=Path)


def main(args: argparse.Namespace) -> int:
    """Run the scenario with parsed flags; the exit status."""
    if not Path(args.nginx).exists():
        print("nginx is not installed (Debian: apt-get install nginx-light)", file=sys.stderr)
        return 2

    from gateway_lab.bench import results

    row = asyncio.run(_measure_on_a_fleet(args))
    return results.write(result(row), json_path=args.json or "")


HEADER = ("calls", "direct p50", "through nginx p50", "added p50", "direct p99", "through nginx p99", "added p99",
          "nginx CPU per call")  # fmt: skip


def result(row: dict[str, Any]) -> Any:
    """The measured row in the common result format (its figures also at the JSON's top level)."""
    from gateway_lab.bench.results import Result, Table

    cells = [row["calls"], *(f"{row[k]:.3f} ms" for k in (
        "direct_p50_ms", "nginx_p50_ms", "added_p50_ms", "direct_p99_ms", "nginx_p99_ms", "added_p99_ms")),
        f"{row['nginx_cpu_us_per_call']:.1f} us"]  # fmt: skip
    return Result(tables=[Table.of("one extra hop, no work (nginx grpc_pass)", HEADER, [cells], labels=1)], data=row)
