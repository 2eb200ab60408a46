#!/usr/bin/env python
"""Where one request's time goes at concurrency 1: a stage timeline of the gateway.

    token-gateway bench latency-timeline --requests 300

A zero-cost simulated fleet (``SubprocessFleet``) runs in one child process and the
gateway (``token-gateway serve``, as deployed) in another, with probes installed before
it starts: wrappers that stamp ``time.perf_counter_ns()`` at each stage boundary of
each request (HTTP bytes in -> ASGI app -> body read -> parsed and validated ->
template rendered -> tokenized -> prepared -> worker selected -> gRPC call started ->
first worker message -> generation read -> response built -> response written). The
probes exist only in the child this script starts; the gateway's own code has no hook.

This process is the client, the cheapest one on each side: a blocking-socket HTTP/1.1
keep-alive client sending pre-built request bytes and reading to Content-Length, and
the same prompt ids sent straight to a worker with grpcio's synchronous stub. Both
processes read one clock (``CLOCK_MONOTONIC``), so the client's send and receive
stamps line up with the gateway's. Printed: per stage the p50 of its duration, the
client's view (wall time gateway vs direct) and the remainder (kernel and wake-ups
between the client's write and the gateway's first read, and back).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

os.environ.setdefault("GRPC_EXPERIMENTS", "-event_engine_client")  # the gateway's own client mode

# ---------------------------------------------------------------- the gateway child (probes)

STAGES = [
    "recv",  # the HTTP protocol got the request's bytes (data_received)
    "app",  # the inference route's ASGI call starts
    "body",  # body read
    "parsed",  # JSON parsed and the request model validated
    "template",  # chat template rendered
    "tokenize",  # prompt ids
    "prepared",  # prompt checks, sampling limits, stop plan
    "selected",  # the policy chose a worker
    "call",  # the gRPC call object exists (request sent)
    "first_msg",  # the worker's first message reached our code
    "open",  # open_generate returned (lease, stream)
    "gen_ready",  # the Generation object (detokenizers, stop matchers, resumer) exists
    "delta",  # the first delta of the generation reached the endpoint
    "gen_done",  # the worker's GenerateComplete read (when it is not the first message)
    "fin_start",  # the generation's end: the stream is finished (lease, metrics, policy)
    "fin_end",
    "reported",  # the policy told what the worker now caches (prompt + output)
    "built",  # the response dict built (chat's _answer returned)
    "written",  # the response's last bytes handed to the transport
]


# ``--detail``: finer stamps inside the stages above (each costs about a microsecond).
DETAIL = [
    # (module, attribute path, stamp before the call or None, stamp after it or None)
    ("gateway.server.http.guard", "GuardedHttpTools.on_headers_complete", None, "d_head"),
    ("gateway.server.http.guard", "GuardedHttpTools.on_message_complete", None, "d_msg"),
    ("gateway.server.observability", "ObservabilityMiddleware.__call__", "d_obs", None),
    ("gateway.server.http.door", "HttpDoor.context_from", None, "d_ctx"),
    ("gateway.endpoints.chat", "choose_parsers", None, "d_parsers"),
    ("gateway.tokenization.chat_template", "ChatTemplate.render", "d_tpl_in", None),
    ("gateway.tokenization.chat_template", "normalize_messages", None, "d_tpl_norm"),
    ("gateway.tokenization.chat_template", "ChatTemplate._render_plain", None, "d_tpl_jinja"),
    ("gateway.tokenization.prefix_cache", "PrefixTokenCache._encode_chunks", "d_tok_in", None),
    ("gateway.tokenization.tokenizer", "Tokenizer.encode_batch", None, "d_tok_enc"),
    ("gateway.pipeline.engine", "Engine.generate_request", None, "d_pb"),
    ("gateway.pipeline.router", "Router.select", "d_route_in", None),
    ("gateway.policies.cache_aware", "CacheAwarePolicy.select", "d_policy_in", "d_policy"),
    ("gateway.pipeline.lease", "Lease.__init__", "d_lease_in", "d_lease"),
    ("gateway.pipeline.prefill_gate", "PrefillHolds.dispatched", None, "d_gate"),
    ("gateway.pipeline.generation", "Generation._on_complete", "d_complete_in", None),
    ("gateway.endpoints.chat", "_choices", None, "d_choices"),
    ("gateway.protocol.responses", "ChatCompletionResponse.to_dict", "d_resp_in", None),
]


def install_detail(stamp: Any) -> None:
    """Wrap the ``DETAIL`` points (sync callables only) with stamps."""
    import importlib
    from functools import wraps

    for module_name, path, before, after in DETAIL:
        owner: Any = importlib.import_module(module_name)
        *parents, attr = path.split(".")
        for name in parents:
            owner = getattr(owner, name)
        fn = getattr(owner, attr)

        def make(fn: Any, before: str | None, after: str | None) -> Any:
            @wraps(fn)
            def wrapper(*a: Any, **k: Any) -> Any:
                if before:
                    stamp(before)
                result = fn(*a, **k)
                if after:
                    stamp(after)
                return result

            return wrapper

        setattr(owner, attr, make(fn, before, after))


def install_probes(out: Path, detail: bool = False) -> None:
    """Wrap the stage boundaries with stamps; write them to ``out`` at exit."""
    import atexit
    from functools import wraps

    from gateway.endpoints import chat as chat_route
    from gateway.pipeline import dispatch, engine, generation
    from gateway.server.http import guard, inference
    from gateway.workers import client

    rows: list[dict[str, int]] = []
    cur: dict[str, int] = {}
    now = time.perf_counter_ns

    import contextvars

    row_var: contextvars.ContextVar[dict[str, int] | None] = contextvars.ContextVar("lat_row", default=None)

    def stamp(name: str) -> None:
        if name == "app":  # the request's task: later stamps (callbacks included) find its row
            row_var.set(cur)
        (row_var.get() or cur).setdefault(name, now())

    proto = guard.GuardedHttpTools
    orig_recv = proto.data_received

    def data_received(self: Any, data: bytes) -> None:
        nonlocal cur
        if data.startswith(b"POST "):
            cur = {"recv": now()}
            rows.append(cur)
        orig_recv(self, data)

    proto.data_received = data_received  # type: ignore[method-assign]

    def around_async(obj: Any, attr: str, before: str | None, after: str | None) -> None:
        fn = getattr(obj, attr)

        @wraps(fn)
        async def wrapper(*a: Any, **k: Any) -> Any:
            if before:
                stamp(before)
            result = await fn(*a, **k)
            if after:
                stamp(after)
            return result

        setattr(obj, attr, wrapper)

    def around_sync(obj: Any, attr: str, after: str, before: str | None = None) -> None:
        fn = getattr(obj, attr)

        @wraps(fn)
        def wrapper(*a: Any, **k: Any) -> Any:
            if before:
                stamp(before)
            result = fn(*a, **k)
            stamp(after)
            return result

        setattr(obj, attr, wrapper)

    around_async(inference.InferencePath, "__call__", "app", None)
    around_async(inference, "read_body", None, "body")
    around_sync(inference, "parse_model", "parsed")
    around_sync(engine.Engine, "prepare", "prepared")
    around_sync(dispatch, "select", "selected")
    around_async(chat_route, "_answer", None, "built")
    around_sync(dispatch.WorkerStream, "finished", "fin_end", "fin_start")
    around_sync(generation.Generation, "_report_output", "reported")
    around_async(inference, "_send_json", None, "written")
    around_async(engine.Engine, "open", None, "open")
    around_async(engine.Engine, "start", None, "gen_ready")
    orig_feed = generation.Generation._feed

    def feed(self: Any, *a: Any) -> Any:
        out = orig_feed(self, *a)
        stamp("delta")
        return out

    generation.Generation._feed = feed  # type: ignore[method-assign,assignment]

    orig_observe = engine.Engine.__init__

    @wraps(orig_observe)
    def init(self: Any, *a: Any, **k: Any) -> None:
        orig_observe(self, *a, **k)
        inner = self._observe

        def observe(stage: str, seconds: float) -> None:
            if stage in ("template", "tokenize"):
                stamp(stage)
            inner(stage, seconds)

        self._observe = observe

    engine.Engine.__init__ = init  # type: ignore[method-assign]

    class StampedCall:
        __slots__ = ("_call", "_n")

        def __init__(self, call: Any) -> None:
            self._call = call
            self._n = 0

        async def read(self) -> Any:
            msg = await self._call.read()
            self._n += 1
            if self._n == 1:
                stamp("first_msg")
            elif msg is not None and getattr(msg, "WhichOneof", None) and msg.WhichOneof("response") == "complete":
                stamp("gen_done")
            return msg

        def __getattr__(self, name: str) -> Any:
            return getattr(self._call, name)

    orig_generate = client.WorkerClient.generate

    def generate(self: Any, request: Any, *, timeout: float | None = None) -> Any:
        call = orig_generate(self, request, timeout=timeout)
        stamp("call")
        return StampedCall(call)

    client.WorkerClient.generate = generate  # type: ignore[method-assign]

    if detail:
        install_detail(stamp)

    def dump() -> None:
        out.write_text(json.dumps(rows))

    atexit.register(dump)


def child_main(argv: list[str]) -> int:
    out = Path(argv[0])
    from gateway.cli import main

    install_probes(out, detail=os.environ.get("LAT_DETAIL") == "1")
    profile_to = os.environ.get("LAT_CPROFILE")
    if profile_to:  # a deterministic profile of the whole run (inflates every call; read shares)
        import atexit
        import cProfile

        prof = cProfile.Profile()
        atexit.register(lambda: prof.dump_stats(profile_to))
        prof.enable()
    return main(["serve", *argv[1:]])


# ---------------------------------------------------------------- the client (this process)


def http_request(host: str, port: int, path: str, body: bytes) -> bytes:
    return (
        f"POST {path} HTTP/1.1\r\nhost: {host}:{port}\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\n\r\n"
    ).encode() + body


class RawHttp:
    """HTTP/1.1 keep-alive on one blocking socket: pre-built bytes out, read to Content-Length."""

    def __init__(self, host: str, port: int) -> None:
        self.sock = socket.create_connection((host, port))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf = b""

    def roundtrip(self, raw: bytes) -> tuple[int, int, bytes]:
        t0 = time.perf_counter_ns()
        self.sock.sendall(raw)
        buf = self.buf
        while b"\r\n\r\n" not in buf:
            buf += self._recv()
        head, _, rest = buf.partition(b"\r\n\r\n")
        length = 0
        for line in head.split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
        while len(rest) < length:
            rest += self._recv()
        t1 = time.perf_counter_ns()
        self.buf = rest[length:]
        if not head.startswith(b"HTTP/1.1 200"):
            raise RuntimeError(f"HTTP {head[:40]!r}: {rest[:200]!r}")
        return t0, t1, rest[:length]

    def _recv(self) -> bytes:
        data = self.sock.recv(65536)
        if not data:
            raise ConnectionError("the gateway closed the connection")
        return data

    def close(self) -> None:
        self.sock.close()


def settle(pid: int, cap_s: float = 20.0, quiet_cpu_s: float = 0.02, window_s: float = 0.5) -> None:
    """Wait (at most ``cap_s``) until process ``pid`` uses under ``quiet_cpu_s`` of CPU in ``window_s``."""
    deadline = time.perf_counter() + cap_s
    while time.perf_counter() < deadline:
        c0 = cpu_s(pid)
        time.sleep(window_s)
        if cpu_s(pid) - c0 < quiet_cpu_s:
            return


def cpu_s(pid: int) -> float:
    """A process's CPU seconds so far (user + system, every thread), from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))] if s else 0.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The scenario's flags (``token-gateway bench NAME --help``)."""
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--prompt-tokens", type=int, default=32)
    parser.add_argument("--max-tokens", type=int, default=8)
    parser.add_argument("--policy", default="cache_aware")
    parser.add_argument("--serve-args", default="", help="extra serve flags")
    parser.add_argument(
        "--warm", type=int, default=300,
        help="gateway requests before the measured ones, then a wait for a quiet gateway: one-off work a "
        "gateway does in its first requests (ours builds its fast encoder at a model's 256th prompt) is "
        "not what it costs once it has served a while",
    )  # fmt: skip
    parser.add_argument("--json", type=Path)
    parser.add_argument("--detail", action="store_true", help="finer stamps inside the stages (see DETAIL)")


def main(args: argparse.Namespace) -> int:
    """Run the scenario with parsed flags; the exit status."""
    if args.detail:
        os.environ["LAT_DETAIL"] = "1"  # the gateway child reads it

    import grpc

    from gateway.proto import sglang_scheduler_pb2 as pb
    from gateway.proto import sglang_scheduler_pb2_grpc as pb_grpc
    from gateway_lab.bench import launch, results
    from gateway_lab.bench.scenarios.overhead import Prompts
    from gateway_lab.bench.workloads import default_tokenizer_dir

    prompts = Prompts(7)
    warm = max(20, args.warm)
    made = [prompts.make(args.prompt_tokens) for _ in range(args.requests + warm)]

    async def with_fleet(stamps: Path) -> dict[str, Any]:
        async with launch.fleet("process", args.workers, launch.ZERO_COST) as fleet:
            argv = [
                sys.executable, "-m", __name__, "--child-gateway", str(stamps), "--worker-urls", *fleet.urls,
                "--policy", args.policy, "--host", "127.0.0.1", "--port", "0", "--log-level", "warning",
                "--tokenizer-path", str(default_tokenizer_dir()), *args.serve_args.split(),
            ]  # fmt: skip
            # a generous stop: the child writes its stamps at exit, after its graceful shutdown
            async with launch.gateway("ours", fleet.urls, args.policy, argv=argv, name="gateway-stamped",
                                      stop_timeout_s=30) as gw:  # fmt: skip
                return await asyncio.get_running_loop().run_in_executor(None, run_against, fleet.urls, gw)

    def run_against(urls: list[str], gw: launch.Gateway) -> dict[str, Any]:
        host, _, port_text = gw.url.removeprefix("http://").rpartition(":")
        port = int(port_text)
        model_probe = RawHttp(host, port)
        model_probe.sock.sendall(b"GET /v1/models HTTP/1.1\r\nhost: x\r\n\r\n")
        time.sleep(0.2)
        body = model_probe.sock.recv(65536).partition(b"\r\n\r\n")[2]
        model = json.loads(body)["data"][0]["id"]
        model_probe.close()
        http = RawHttp(host, port)
        channels = [grpc.insecure_channel(u.removeprefix("grpc://")) for u in urls]
        stubs = [pb_grpc.SglangSchedulerStub(c) for c in channels]

        def direct(i: int, ids: list[int]) -> tuple[int, int]:
            request = pb.GenerateRequest(
                request_id=uuid.uuid4().hex, tokenized=pb.TokenizedInput(input_ids=ids),
                sampling_params=pb.SamplingParams(temperature=0.0, n=1, max_new_tokens=args.max_tokens, ignore_eos=True),
                stream=False,
            )  # fmt: skip
            t0 = time.perf_counter_ns()
            for _ in stubs[i % len(stubs)].Generate(request, timeout=60):
                pass
            return t0, time.perf_counter_ns()

        def gateway(messages: list[dict[str, str]]) -> tuple[int, int]:
            body = json.dumps({
                "model": model, "messages": messages, "max_tokens": args.max_tokens,
                "temperature": 0.0, "ignore_eos": True,
            }).encode()  # fmt: skip
            raw = http_request(host, port, "/v1/chat/completions", body)
            t0, t1, _ = http.roundtrip(raw)
            return t0, t1

        try:
            for i in range(warm):  # warm: connections, first-use costs, one-off builds
                gateway(made[i][0])
                if i >= warm - 20:
                    direct(i, made[i][1])
            settle(gw.pid)
            http.close()  # the wait may outlast the gateway's keep-alive (5 s): a fresh connection
            http = RawHttp(host, port)
            gw_times: list[tuple[int, int]] = []
            dr: list[tuple[int, int]] = []
            cpu0 = cpu_s(gw.pid)
            for i in range(warm, warm + args.requests):
                messages, ids = made[i]
                if i % 2:
                    gw_times.append(gateway(messages))
                    dr.append(direct(i, ids))
                else:
                    dr.append(direct(i, ids))
                    gw_times.append(gateway(messages))
            cpu = cpu_s(gw.pid) - cpu0
        finally:
            http.close()
            for c in channels:
                c.close()
        return {"gw": gw_times, "direct": dr, "ready": gw.ready_info, "cpu_s": cpu}

    stamps = Path(tempfile.mkstemp(prefix="lat-stamps-", suffix=".json")[1])
    try:
        result = asyncio.run(with_fleet(stamps))
        gw, dr = result["gw"], result["direct"]
        rows = json.loads(stamps.read_text())[-len(gw):]
    finally:
        stamps.unlink(missing_ok=True)
    report: dict[str, Any] = {}
    prev = "client_send"
    lines: list[tuple[str, str, str, int]] = []
    # In the order they happen (bookkeeping deferred past the answer comes after "written").
    names = list(dict.fromkeys(n for n in STAGES + [n for d in DETAIL for n in d[2:] if n]))
    order = sorted(
        (st for st in names if any(st in r for r in rows)),
        key=lambda st: pct([r[st] - r["recv"] for r in rows if st in r], 0.5),
    )
    for stage in order:
        d = []
        for (t0, _), row in zip(gw, rows, strict=True):
            start = t0 if prev == "client_send" else row.get(prev)
            if stage in row and start is not None:
                d.append((row[stage] - start) / 1e3)
        if d:
            lines.append((prev, stage, f"{pct(d, 0.5):.1f}", len(d)))
            report[f"{prev}->{stage}"] = round(pct(d, 0.5), 1)
            prev = stage
    back = [(t1 - row["written"]) / 1e3 for (_, t1), row in zip(gw, rows, strict=True) if "written" in row]
    lines.append(("written", "client_recv", f"{pct(back, 0.5):.1f}", len(back)))
    report["written->client_recv"] = round(pct(back, 0.5), 1)
    inside = [(row["written"] - row["recv"]) / 1e3 for row in rows if "written" in row]
    grpc_leg = [(row["first_msg"] - row["call"]) / 1e3 for row in rows if "first_msg" in row]
    g = [(t1 - t0) / 1e3 for t0, t1 in gw]
    d = [(t1 - t0) / 1e3 for t0, t1 in dr]
    summary = {
        "gateway_p50_us": pct(g, 0.5), "direct_p50_us": pct(d, 0.5), "added_p50_us": pct(g, 0.5) - pct(d, 0.5),
        "gateway_p99_us": pct(g, 0.99), "direct_p99_us": pct(d, 0.99),
        "inside_gateway_p50_us": pct(inside, 0.5), "grpc_call_to_first_msg_p50_us": pct(grpc_leg, 0.5),
        # the gateway process's CPU (user + system, all threads) per request, from /proc
        "gateway_cpu_us_per_request": result["cpu_s"] * 1e6 / max(1, len(gw)),
    }  # fmt: skip
    report |= {k: round(v, 1) for k, v in summary.items()}
    report["load_1min"] = round(os.getloadavg()[0], 2)
    stages = results.Table.of(f"{len(gw)} requests, stage by stage", ("from", "to", "p50 us", "n"), lines)
    totals = results.Table.of("totals", ("figure", "us"), [(k, f"{v:.1f}") for k, v in summary.items()], labels=1)
    return results.write(results.Result(tables=[stages, totals], data=report), json_path=args.json or "")


if __name__ == "__main__" and sys.argv[1:2] == ["--child-gateway"]:  # the gateway child main() starts
    raise SystemExit(child_main(sys.argv[2:]))
