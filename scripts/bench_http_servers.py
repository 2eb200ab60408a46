#!/usr/bin/env python
"""The HTTP server's own cost per request at concurrency 1: uvicorn (as the gateway runs
it) against granian (ASGI and RSGI), on the same minimal app.

    .venv/bin/python scripts/bench_http_servers.py --requests 3000

The app does what the hot routes do at the HTTP level and nothing else: read a ~300-byte
JSON body and answer ~400 bytes of JSON with a Content-Length (no parsing, no routing).
Each server runs in its own process (granian embedded in an asyncio loop, uvloop for
both, one worker), driven by one blocking-socket keep-alive client with pre-built request
bytes (the timeline's ``RawHttp``), alternating servers in rounds. Printed per server: the
client's round-trip p50 / p90 and the server process's CPU per request (user + system from
``/proc``, every thread). granian is not a dependency: install it anywhere on
``PYTHONPATH`` to include it (``pip install --target DIR granian``); without it only
uvicorn is measured.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

BODY = json.dumps({"model": "m", "messages": [{"role": "user", "content": "x" * 200}], "max_tokens": 8}).encode()
ANSWER = json.dumps({"id": "chatcmpl-" + "0" * 32, "object": "chat.completion", "created": 0, "model": "m",
                     "choices": [{"index": 0, "message": {"role": "assistant", "content": "y" * 120},
                                  "finish_reason": "length"}],
                     "usage": {"prompt_tokens": 32, "completion_tokens": 8, "total_tokens": 40}}).encode()  # fmt: skip


async def asgi_app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] != "http":
        return
    more = True
    while more:
        message = await receive()
        more = message.get("more_body", False)
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(ANSWER)).encode())]})
    await send({"type": "http.response.body", "body": ANSWER})


async def rsgi_app(scope: Any, proto: Any) -> None:
    await proto()
    proto.response_bytes(200, [("content-type", "application/json")], ANSWER)


def serve(kind: str, port: int) -> None:
    """The server process: one server on 127.0.0.1:port until killed."""
    import asyncio

    import uvloop

    uvloop.install()
    if kind == "uvicorn":
        sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
        import uvicorn

        from gateway.server.http.guard import http_server_config
        from gateway.server.http.limits import HttpLimitsConfig

        config = http_server_config(asgi_app, HttpLimitsConfig(), host="127.0.0.1", port=port, access_log=False)
        asyncio.run(uvicorn.Server(config).serve())
        return
    from granian.constants import Interfaces
    from granian.server.embed import Server

    interface = Interfaces.RSGI if kind == "granian-rsgi" else Interfaces.ASGI
    target = rsgi_app if kind == "granian-rsgi" else asgi_app
    server = Server(target, address="127.0.0.1", port=port, interface=interface, log_enabled=False)
    asyncio.run(server.serve())


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def roundtrip(sock: socket.socket, raw: bytes, buf: bytes) -> tuple[int, bytes]:
    t0 = time.perf_counter_ns()
    sock.sendall(raw)
    while b"\r\n\r\n" not in buf:
        buf += sock.recv(65536)
    head, _, rest = buf.partition(b"\r\n\r\n")
    length = next(int(v) for k, _, v in (line.partition(b":") for line in head.split(b"\r\n")[1:])
                  if k.strip().lower() == b"content-length")  # fmt: skip
    while len(rest) < length:
        rest += sock.recv(65536)
    if not head.startswith(b"HTTP/1.1 200"):
        raise RuntimeError(head[:60])
    return time.perf_counter_ns() - t0, rest[length:]


def main() -> int:
    if len(sys.argv) > 2 and sys.argv[1] == "--serve":
        serve(sys.argv[2], int(sys.argv[3]))
        return 0
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=3000, help="per server, over all rounds")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--gap-ms", type=float, default=1.0, help="idle time between requests (a worker's reply time)")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    kinds = ["uvicorn"]
    try:
        import granian  # noqa: F401

        kinds += ["granian-asgi", "granian-rsgi"]
    except ImportError:
        print("granian not importable: uvicorn only")
    servers: dict[str, tuple[subprocess.Popen[bytes], int]] = {}
    results: dict[str, dict[str, list[float]]] = {k: {"rtt": [], "cpu": []} for k in kinds}
    try:
        for kind in kinds:
            port = free_port()
            servers[kind] = (subprocess.Popen([sys.executable, __file__, "--serve", kind, str(port)]), port)
        for kind, (_, port) in servers.items():
            for _ in range(100):
                try:
                    socket.create_connection(("127.0.0.1", port), timeout=1).close()
                    break
                except OSError:
                    time.sleep(0.05)
            else:
                raise RuntimeError(f"{kind} did not start")
        raw = (b"POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\n"
               b"content-length: %d\r\n\r\n" % len(BODY)) + BODY  # fmt: skip
        per_round = max(1, args.requests // args.rounds)
        for _ in range(args.rounds):
            for kind, (proc, port) in servers.items():
                sock = socket.create_connection(("127.0.0.1", port))
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                buf = b""
                for _ in range(50):  # warm
                    _, buf = roundtrip(sock, raw, buf)
                cpu0 = cpu_s(proc.pid)
                for _ in range(per_round):
                    time.sleep(args.gap_ms / 1e3)
                    ns, buf = roundtrip(sock, raw, buf)
                    results[kind]["rtt"].append(ns / 1e3)
                results[kind]["cpu"].append((cpu_s(proc.pid) - cpu0) * 1e6 / per_round)
                sock.close()
    finally:
        for proc, _ in servers.values():
            proc.terminate()
        for proc, _ in servers.values():
            proc.wait(10)
    report: dict[str, Any] = {"load_1min": round(os.getloadavg()[0], 2)}
    print(f"load {report['load_1min']}; {args.rounds} rounds, {args.gap_ms} ms between requests")
    for kind, r in results.items():
        rtt = sorted(r["rtt"])
        row = {"rtt_p50_us": round(rtt[len(rtt) // 2], 1), "rtt_p90_us": round(rtt[int(len(rtt) * 0.9)], 1),
               "cpu_us_per_request": round(sorted(r["cpu"])[len(r["cpu"]) // 2], 1),
               "cpu_rounds": [round(c, 1) for c in r["cpu"]]}  # fmt: skip
        report[kind] = row
        print(f"  {kind:<13} rtt p50 {row['rtt_p50_us']:7.1f} us  p90 {row['rtt_p90_us']:7.1f} us  "
              f"server CPU {row['cpu_us_per_request']:6.1f} us/request (rounds {row['cpu_rounds']})")  # fmt: skip
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
