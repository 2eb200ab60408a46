#!/usr/bin/env python
"""What the gateway adds on top of its workers: latency, requests/s, relayed tokens/s.

    token-gateway bench overhead                     # every section
    token-gateway bench overhead --sections latency --profile prof/

A simulated fleet whose steps cost nothing (every cost and ``time_scale`` at 0) runs in
one child process and ``token-gateway serve`` in another (both from
``gateway_lab.bench.launch``); this process is the client. Sections:

* ``latency``: one request at a time, alternating between the gateway
  (``/v1/chat/completions``, httpx) and the same worker called directly over gRPC with
  the same prompt token ids (grpc.aio), non-streaming and streaming. The added latency
  is gateway minus direct, per percentile (p50, p99) of the two distributions.
* ``throughput``: ``--concurrency`` requests in flight (closed loop), non-streaming
  short answers: sustained requests/s through one gateway process.
* ``stream``: ``--streams`` concurrent streams of ``--stream-tokens`` tokens each (one
  worker chunk per token): tokens/s relayed as SSE.
* ``prompt-scaling``: latency (non-streaming) and requests/s for each ``--prompt-lengths``.
* ``worker-scaling``: the same for each ``--worker-counts`` (all workers in one process).
* ``compare`` (only when asked for): token-gateway and, when ``--peers-python`` exists, SMG
  (and ``before``: another checkout's ``src/``) side by side on the same fleets and loads:
  short chat at 128 in flight and one at a time (added latency and TTFT against direct
  gRPC), multi-turn chat, and the shared-prefix (gsp) burst; per gateway requests/s, CPU
  per request and per relayed token, SSE events per token, idle CPU. The client is
  aiohttp, cheaper than what it measures. ``--repeat`` runs the round again for the spread,
  the gateways in reverse order every other round.
* ``start`` (only when asked for): the gsp burst's requests (``--gsp-*``) through the real
  app in process (``GatewayApp``'s inference path, the engine, the router and its policy over
  ``--gsp-workers`` simulated workers' registrations), each worker's Generate replaced by
  an in-memory stream of ``--gsp-output-tokens`` tokens and ``send`` by a null one: the
  gateway's own code per request without gRPC or uvicorn, CPU per request (every thread)
  and by thread, over ``--start-bursts`` bursts on cold prompt caches and fresh policies.
  With ``PYTHONPATH=OTHER/src`` it measures that checkout's code.
* ``relay`` (only when asked for): CPU per token of the gateway's own relay code, in
  process (worker messages -> detokenize, stops -> stream events -> SSE bytes), next to
  the CPU per message a bare grpc.aio client pays to read a worker's stream and the CPU
  per event a bare uvicorn app pays to write an SSE stream: the two I/O floors; and the
  CPU and p50 wall time of one bare grpc.aio Generate call at a time (the floor under the
  added latency at concurrency 1).

Every chat prompt is unique (fresh seeded words), so the gateway's multi-turn
tokenization cache does not hide the cost of templating and tokenizing. Every loop is
bounded by a request count and ``--cap-s`` seconds. Beside wall-clock figures, the
script reads each process's CPU time from /proc: on a shared machine, the gateway's
CPU per request is the steadier number. ``--profile DIR`` samples the gateway with
py-spy during the throughput and stream phases and prints where its time goes, per
pipeline stage (HTTP parse, template, tokenize, select, dispatch, relay, SSE encode);
``--profile-tool py-spy-native`` adds C frames, ``--profile-tool perf`` records every
thread down to the kernel (``perf report -i DIR/NAME.perf.data``).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import dataclasses
import datetime
import itertools
import os
import random
import re
import shlex
import shutil
import socket
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import httpx
import orjson

from gateway.proto import sglang_scheduler_pb2 as pb
from gateway.proto import sglang_scheduler_pb2_grpc as pb_grpc
from gateway.tokenization import Tokenizer
from gateway.workers.transport import END_OF_STREAM
from gateway_lab.bench import launch
from gateway_lab.bench.machine import cpu_seconds
from gateway_lab.bench.results import Result, Table, write
from gateway_lab.bench.workloads import default_tokenizer_dir
from gateway_lab.sim.config import SimConfig

SECTIONS = ["latency", "throughput", "stream", "prompt-scaling", "worker-scaling"]
ALL_SECTIONS = [*SECTIONS, "compare", "relay", "start"]  # compare, relay and start run only when asked for
LOADS = ["short", "multi-turn", "gsp"]
SYSTEM_PROMPT = "You are a helpful assistant. Answer briefly."


# ---------------------------------------------------------------- prompts


class Prompts:
    """Unique chat prompts of a target rendered length, with their token ids.

    Text is sentences of the vocabulary's whole words drawn with a Zipf law over
    vocabulary order, as in ``bench_tokenize.py``: common words repeat as in real text.
    (Uniform draws make every word rare, which defeats the tokenizer's word cache and
    makes tokenization dearer than on real text.)
    """

    def __init__(self, seed: int) -> None:
        self.tokenizer = Tokenizer.from_path(default_tokenizer_dir())
        vocab = self.tokenizer.backend.get_vocab()
        pieces = sorted((i, p[1:]) for p, i in vocab.items() if p.startswith("Ġ") and p[1:].isalpha())
        self.words = [w for _, w in pieces]
        self.cum_weights = list(itertools.accumulate(1.0 / (rank + 10) for rank in range(len(self.words))))
        self.rng = random.Random(seed)
        self.overhead = len(self._render(""))  # template tokens around an empty user message
        sample = self._text(4000)
        self.words_per_token = (sample.count(" ") + 1) / len(self.tokenizer.encode(sample, add_special_tokens=False))

    def _render(self, user: str) -> list[int]:
        text = self.tokenizer.apply_chat_template(self._messages(user), add_generation_prompt=True)
        return self.tokenizer.encode(text, add_special_tokens=False)

    @staticmethod
    def first_chat() -> list[dict[str, str]]:
        return Prompts._messages("Hello!")

    @staticmethod
    def _messages(user: str) -> list[dict[str, str]]:
        return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": user}]

    def _text(self, words: int) -> str:
        sentences: list[str] = []
        while words > 0:
            k = self.rng.randint(6, 18)
            picked = self.rng.choices(self.words, cum_weights=self.cum_weights, k=k)
            sentences.append(" ".join(picked).capitalize() + self.rng.choice(".?!."))
            words -= k
        return " ".join(sentences)

    def messages(self, tokens: int) -> list[dict[str, str]]:
        """A fresh chat of about ``tokens`` rendered prompt tokens (words per token calibrated once)."""
        return self._messages(self._text(max(1, round((tokens - self.overhead) * self.words_per_token))))

    def make(self, tokens: int) -> tuple[list[dict[str, str]], list[int]]:
        """(messages, rendered prompt ids) of about ``tokens`` prompt tokens."""
        messages = self.messages(tokens)
        return messages, self._render(messages[1]["content"])


# ---------------------------------------------------------------- process CPU




@dataclass
class CpuMeter:
    """CPU seconds each process spent between ``start`` and ``stop``."""

    pids: dict[str, int]
    spent: dict[str, float] = field(default_factory=dict)
    _t0: dict[str, float] = field(default_factory=dict)

    def start(self) -> None:
        self._t0 = {name: self._now(pid) for name, pid in self.pids.items()}

    def stop(self) -> dict[str, float]:
        self.spent = {name: self._now(pid) - self._t0[name] for name, pid in self.pids.items()}
        return self.spent

    @staticmethod
    def _now(pid: int) -> float:
        if pid == os.getpid():
            t = os.times()
            return t.user + t.system
        return cpu_seconds(pid)


# ---------------------------------------------------------------- one request each way


def pct(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    k = (len(ordered) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


@dataclass
class Timing:
    total_s: float
    ttft_s: float
    tokens: int


class Target:
    """The same request, through the gateway (HTTP) or straight to a worker (gRPC)."""

    def __init__(self, gateway_url: str, worker_urls: Sequence[str], model: str, max_tokens: int):
        self.url = gateway_url + "/v1/chat/completions"
        self.worker_urls = list(worker_urls)
        self.model = model
        self.max_tokens = max_tokens
        limits = httpx.Limits(max_connections=512, max_keepalive_connections=512)
        self.http = httpx.AsyncClient(timeout=120, limits=limits, trust_env=False)
        options = [("grpc.max_send_message_length", 256 << 20), ("grpc.max_receive_message_length", 256 << 20)]
        self.channels = [grpc.aio.insecure_channel(u.removeprefix("grpc://"), options=options) for u in worker_urls]
        self.stubs = [pb_grpc.SglangSchedulerStub(c) for c in self.channels]
        self._next = itertools.count()

    async def close(self) -> None:
        await self.http.aclose()
        for channel in self.channels:
            await channel.close()

    async def gateway(self, messages: list[dict[str, str]], stream: bool, max_tokens: int | None = None) -> Timing:
        body = {
            "model": self.model, "messages": messages, "max_tokens": max_tokens or self.max_tokens,
            "temperature": 0.0, "ignore_eos": True, "stream": stream,
        }  # fmt: skip
        if stream:
            body["stream_options"] = {"include_usage": True}
        t0 = time.perf_counter()
        ttft = 0.0
        tokens = 0
        if not stream:
            response = await self.http.post(self.url, content=orjson.dumps(body), headers={"content-type": "application/json"})
            if response.status_code != 200:
                raise RuntimeError(f"gateway HTTP {response.status_code}: {response.text[:300]}")
            tokens = int(orjson.loads(response.content)["usage"]["completion_tokens"])
            total = time.perf_counter() - t0
            return Timing(total, total, tokens)
        async with self.http.stream("POST", self.url, content=orjson.dumps(body), headers={"content-type": "application/json"}) as response:
            if response.status_code != 200:
                raise RuntimeError(f"gateway HTTP {response.status_code}: {(await response.aread())[:300]!r}")
            async for line in response.aiter_lines():
                if not line.startswith("data: "):
                    continue
                if line == "data: [DONE]":
                    break
                chunk = orjson.loads(line[6:])
                if "error" in chunk:
                    raise RuntimeError(f"gateway stream error: {chunk['error']}")
                if not ttft and any((c.get("delta") or {}).get("content") for c in chunk.get("choices") or ()):
                    ttft = time.perf_counter() - t0
                if chunk.get("usage"):
                    tokens = int(chunk["usage"]["completion_tokens"])
        return Timing(time.perf_counter() - t0, ttft, tokens)

    async def direct(self, ids: list[int], stream: bool, max_tokens: int | None = None) -> Timing:
        stub = self.stubs[next(self._next) % len(self.stubs)]
        request = pb.GenerateRequest(
            request_id=uuid.uuid4().hex,
            tokenized=pb.TokenizedInput(input_ids=ids),
            sampling_params=pb.SamplingParams(temperature=0.0, n=1, max_new_tokens=max_tokens or self.max_tokens, ignore_eos=True),
            stream=stream,
        )
        t0 = time.perf_counter()
        ttft = 0.0
        tokens = 0
        async for message in stub.Generate(request, timeout=120):
            if message.HasField("chunk"):
                tokens += len(message.chunk.token_ids)
                if not ttft:
                    ttft = time.perf_counter() - t0
            elif message.HasField("complete") and not stream:
                tokens = len(message.complete.output_ids)
        total = time.perf_counter() - t0
        return Timing(total, ttft or total, tokens)


# ---------------------------------------------------------------- phases


def load_note() -> str:
    one, five, _ = os.getloadavg()
    return f"load {one:.1f}/{five:.1f}"


async def latency_phase(target: Target, prompts: Prompts, tokens: int, requests: int, stream: bool, cap_s: float) -> dict[str, Any]:
    """Alternate gateway and direct calls one at a time; compare their percentiles."""
    gw: list[Timing] = []
    direct: list[Timing] = []
    deadline = time.perf_counter() + cap_s
    await target.gateway(prompts.messages(tokens), stream)  # warm: connections, first-use costs
    await target.direct(prompts.make(tokens)[1], stream)
    sizes: list[int] = []
    for i in range(requests):
        if time.perf_counter() > deadline:
            break
        messages, ids = prompts.make(tokens)
        sizes.append(len(ids))
        if i % 2 == 0:  # alternate who goes first, so neither always meets a warmer machine
            gw.append(await target.gateway(messages, stream))
            direct.append(await target.direct(ids, stream))
        else:
            direct.append(await target.direct(ids, stream))
            gw.append(await target.gateway(messages, stream))
    out: dict[str, Any] = {"prompt_tokens": round(sum(sizes) / max(1, len(sizes))), "stream": stream, "pairs": len(gw)}
    for key in ("total_s", "ttft_s") if stream else ("total_s",):
        g = [getattr(t, key) * 1e3 for t in gw]
        d = [getattr(t, key) * 1e3 for t in direct]
        label = "ttft" if key == "ttft_s" else "total"
        for q, qn in ((0.5, "p50"), (0.99, "p99")):
            out[f"{label}_gateway_{qn}_ms"] = round(pct(g, q), 3)
            out[f"{label}_direct_{qn}_ms"] = round(pct(d, q), 3)
            out[f"{label}_added_{qn}_ms"] = round(pct(g, q) - pct(d, q), 3)
    return out


async def closed_loop(
    call: Callable[[int], Awaitable[Timing]], concurrency: int, requests: int, cap_s: float
) -> tuple[list[Timing], float]:
    """``concurrency`` callers sharing ``requests``; stop starting new ones after ``cap_s``."""
    results: list[Timing] = []
    counter = itertools.count()
    deadline = time.perf_counter() + cap_s

    async def caller() -> None:
        while time.perf_counter() < deadline:
            i = next(counter)
            if i >= requests:
                return
            results.append(await call(i))

    t0 = time.perf_counter()
    await asyncio.gather(*(caller() for _ in range(concurrency)))
    return results, time.perf_counter() - t0


async def throughput_phase(
    target: Target, prompts: Prompts, meter: CpuMeter, tokens: int, concurrency: int, requests: int, cap_s: float
) -> dict[str, Any]:
    pool = [prompts.messages(tokens) for _ in range(min(requests, 4096))]  # made before timing
    meter.start()
    done, wall = await closed_loop(lambda i: target.gateway(pool[i % len(pool)], False), concurrency, requests, cap_s)
    cpu = meter.stop()
    latencies = [t.total_s * 1e3 for t in done]
    return {
        "prompt_tokens": tokens, "concurrency": concurrency, "requests": len(done), "seconds": round(wall, 2),
        "requests_per_s": round(len(done) / wall, 1),
        "latency_p50_ms": round(pct(latencies, 0.5), 2), "latency_p99_ms": round(pct(latencies, 0.99), 2),
        "gateway_cpu_ms_per_request": round(1e3 * cpu["gateway"] / max(1, len(done)), 3),
        "worker_cpu_ms_per_request": round(1e3 * cpu["workers"] / max(1, len(done)), 3),
        "client_cpu_ms_per_request": round(1e3 * cpu["client"] / max(1, len(done)), 3),
        "gateway_cpu_share": round(cpu["gateway"] / wall, 2),
    }  # fmt: skip


async def stream_phase(
    target: Target, prompts: Prompts, meter: CpuMeter, streams: int, tokens_each: int, cap_s: float
) -> dict[str, Any]:
    pool = [prompts.messages(256) for _ in range(streams)]
    meter.start()
    done, wall = await closed_loop(lambda i: target.gateway(pool[i], True, tokens_each), streams, streams, cap_s + 600)
    cpu = meter.stop()
    relayed = sum(t.tokens for t in done)
    return {
        "streams": streams, "tokens_each": tokens_each, "tokens": relayed, "seconds": round(wall, 2),
        "tokens_per_s": round(relayed / wall, 1),
        "gateway_cpu_us_per_token": round(1e6 * cpu["gateway"] / max(1, relayed), 2),
        "worker_cpu_us_per_token": round(1e6 * cpu["workers"] / max(1, relayed), 2),
        "client_cpu_us_per_token": round(1e6 * cpu["client"] / max(1, relayed), 2),
        "gateway_cpu_share": round(cpu["gateway"] / wall, 2),
    }  # fmt: skip


# ---------------------------------------------------------------- profiling


# Pipeline stages, matched against py-spy frames ("function (file:line)"); first match wins,
# scanning each stack from its innermost frame outwards.
STAGES: list[tuple[str, tuple[str, ...]]] = [
    ("sse encode", ("server/http/sse.py", "protocol/stream.py", "_Request._stream")),
    ("template", ("chat_template.py", "jinja2")),
    ("tokenize", ("prefix_cache.py", "tokenizer.py", "encode_batch", ": tokenize_")),
    ("select (policy)", ("gateway/policies/", "pipeline/router.py")),
    ("relay (detok, stops, chunks)", ("pipeline/generation.py", "tokenization/stops.py", "tokenization/detokenizer.py", "endpoints/chat.py", "endpoints/completions.py")),
    ("dispatch (gRPC)", ("pipeline/dispatch.py", "workers/client.py", "grpc/", "_cython/", "(_poll_wrapper)")),
    ("request parse/validate", ("server/http_util.py", "protocol/", "pydantic")),
    ("HTTP server (uvicorn/starlette)", ("uvicorn/", "starlette/", "fastapi/", "httptools", "h11")),
    ("event loop / other", ("",)),
]


def stage_of(stack: str) -> str:
    frames = stack.split(";")
    for frame in reversed(frames):
        for stage, needles in STAGES[:-1]:
            if any(n in frame for n in needles):
                return stage
    return STAGES[-1][0]


def summarize_profile(raw: Path, top: int = 25) -> dict[str, Any]:
    """Stage shares and the hottest functions (self time) from py-spy's collapsed stacks."""
    stages: collections.Counter[str] = collections.Counter()
    leaves: collections.Counter[str] = collections.Counter()
    total = 0
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not count.isdigit():
            continue
        n = int(count)
        total += n
        stages[stage_of(stack)] += n
        leaves[stack.split(";")[-1]] += n
    share = {k: round(100 * v / max(1, total), 1) for k, v in stages.most_common()}
    hot = [(round(100 * v / max(1, total), 1), k) for k, v in leaves.most_common(top)]
    return {"samples": total, "stage_percent": share, "top_self_percent": hot}


PROFILE_TOOLS = ("py-spy", "py-spy-native", "perf")
PROFILE_TOOL = "py-spy"  # --profile-tool


def profiler_command(tool: str, pid: int, out: Path, rate: int, gil: bool) -> list[str]:
    """The sampler for ``--profile-tool``: py-spy (Python frames, nonblocking), py-spy with
    native frames (C extensions too; py-spy then pauses the process per sample), or perf
    (every thread down to the kernel, ``perf report -i OUT``; needs perf_event access)."""
    if tool == "perf":
        return ["perf", "record", "-F", str(rate), "-g", "-p", str(pid), "-o", str(out)]
    spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    mode = ["--native"] if tool == "py-spy-native" else ["--nonblocking"]
    return [spy, "record", "--pid", str(pid), "--format", "raw", "--rate", str(rate), *mode, "--threads",
            *(["--gil"] if gil else []), "-o", str(out)]  # fmt: skip


@contextlib.contextmanager
def profiling(pid: int, out: Path | None, rate: int, gil: bool) -> Any:
    """Sample ``pid`` with ``PROFILE_TOOL`` while the block runs (no-op when ``out`` is None;
    perf writes ``OUT.perf.data`` instead of py-spy's collapsed stacks)."""
    if out is None:
        yield
        return
    if PROFILE_TOOL == "perf":
        out = out.with_suffix(".perf.data")
    out.parent.mkdir(parents=True, exist_ok=True)
    proc = subprocess.Popen(
        profiler_command(PROFILE_TOOL, pid, out, rate, gil), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )
    try:
        time.sleep(0.5)  # let it attach
        yield
    finally:
        proc.send_signal(2)  # SIGINT: the sampler writes its file and exits
        try:
            _, err = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            _, err = proc.communicate()
        if not out.exists():
            print(f"{PROFILE_TOOL} wrote nothing: {err[-500:]}", file=sys.stderr)
        elif PROFILE_TOOL == "perf":
            print(f"perf profile: perf report -i {out}", flush=True)


# ---------------------------------------------------------------- relay: what one token costs, by part


class _ScriptedStream:
    """A worker stream that hands ``Generation`` prepared messages (no gRPC, no sockets)."""

    def __init__(self, messages: list[pb.GenerateResponse]) -> None:
        from gateway.pipeline.observer import NULL_OBSERVER

        self._messages = collections.deque(messages)
        self.closed = False
        self.worker = type("W", (), {"id": "w0"})()
        self.observer = NULL_OBSERVER

    async def read(self) -> pb.GenerateResponse | None:
        return self._messages.popleft() if self._messages else None

    def ready(self) -> bool:
        return False  # one message per read, as a worker one token ahead of nobody

    def finished(self) -> None:
        self.closed = True

    def output(self, output_ids: Any) -> None:
        """No policy learns from a scripted stream."""

    async def aclose(self) -> None:
        self.closed = True

    async def abort(self, reason: str = "") -> None:
        self.closed = True


class _NullSend:
    """The ASGI ``send`` under the hot path's stream loop: counts messages, writes nothing."""

    def __init__(self) -> None:
        self.messages = 0

    async def __call__(self, message: Any) -> None:
        self.messages += 1


def _inference_request(send: _NullSend) -> Any:
    """An inference-path request object with only what ``_Request._stream`` uses."""
    from gateway.server.http import inference
    from gateway.server.http.sse import DONE

    door = type("Door", (), {"headers_for": staticmethod(lambda ctx: {"x-request-id": ctx.request_id})})()
    request = inference._Request.__new__(inference._Request)
    request.send_raw = send
    task = asyncio.current_task()
    assert task is not None  # called inside the measuring coroutine
    request.task = task  # the stream's relay task is made on its loop
    request.scope = {}  # no server extensions: every event goes through ``send``
    request.started = request.complete = request.gone = False
    request.path = type("Path", (), {"door": door})()
    request.route = type("Route", (), {"done": DONE, "error_body": None})()  # an OpenAI route's stream end
    return request


async def relay_code_us_per_token(prompts: Prompts, tokens: int, reps: int, *, chat: bool = False) -> dict[str, float]:
    """CPU per token of the gateway's own relay code, in process, on the HTTP hot path:
    serialized worker messages -> protobuf parse -> ``Generation`` (detokenizer, stop
    handling) -> completion stream events (``chat``: chat chunks, no parser) -> SSE bytes ->
    ``send`` (a null ASGI send: no uvicorn, no socket). Also the protobuf parse alone, per message."""
    from gateway.endpoints import chat as chat_route
    from gateway.endpoints import completions
    from gateway.endpoints.chat_parsers import ChatParsers
    from gateway.endpoints.events import Events
    from gateway.pipeline.generation import Generation
    from gateway.pipeline.prepared import PreparedRequest
    from gateway.pipeline.request_context import RequestContext
    from gateway.protocol.chat import ChatCompletionRequest
    from gateway.protocol.completions import CompletionRequest
    from gateway.protocol.sampling import sampling_from_chat, sampling_from_completion
    from gateway.server.http.sse import SSE_FRAME
    from gateway.tokenization import StopPlan

    tok = prompts.tokenizer
    ids = prompts.make(tokens + 64)[1][-tokens:]
    req = CompletionRequest.model_validate({"model": "m", "prompt": [1, 2, 3], "max_tokens": tokens, "stream": True})
    sampling = sampling_from_completion(req)
    chat_req = ChatCompletionRequest.model_validate({
        "model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": tokens, "stream": True,
    })  # fmt: skip
    if chat:
        sampling = sampling_from_chat(chat_req)
    no_parsers = ChatParsers(
        reasoning_enabled=False, enable_thinking=False, separate_reasoning=False, tool_choice="none", tools=(), think_end_id=None,
    )  # fmt: skip
    entry: Any = type("E", (), {"name": "m", "tokenizer": tok, "reply_cache": None})()
    raw = [
        pb.GenerateResponse(chunk=pb.GenerateStreamChunk(
            token_ids=[t], prompt_tokens=2176, completion_tokens=i + 1, cached_tokens=2048,
        )).SerializeToString()
        for i, t in enumerate(ids)
    ]  # fmt: skip
    raw.append(pb.GenerateResponse(complete=pb.GenerateComplete(
        output_ids=ids[-1:], finish_reason="length", prompt_tokens=2176, cached_tokens=2048,
    )).SerializeToString())  # fmt: skip
    parse = pb.GenerateResponse.FromString

    class Wire(_ScriptedStream):
        """The worker's messages as bytes, parsed on read as gRPC's deserializer does."""

        def __init__(self) -> None:
            super().__init__([])
            self._raw = collections.deque(raw)

        async def read(self) -> pb.GenerateResponse | None:
            return parse(self._raw.popleft()) if self._raw else None

    send = _NullSend()

    async def one() -> None:
        plan = StopPlan.build(tok, stop=[], stop_token_ids=[], ignore_eos=False, skip_special_tokens=True)
        prepared = PreparedRequest("r", "m", [1, 2, 3], sampling, plan, tok, stream=True)
        ctx = RequestContext()
        gen = Generation(Wire(), prepared)  # type: ignore[arg-type]
        if chat:
            chunks: Any = chat_route._chunks(chat_req, entry, gen, "", no_parsers, ctx, SSE_FRAME)
        else:
            chunks = completions.json_events(req, entry, [gen], ctx, SSE_FRAME)
        await _inference_request(send)._stream(Events(chunks, [gen]), ctx)

    for _ in range(5):
        await one()
    t0 = time.process_time()
    for _ in range(reps):
        await one()
    relay = 1e6 * (time.process_time() - t0) / (reps * tokens)
    t0 = time.process_time()
    for _ in range(reps):
        for message in raw:
            parse(message)
    return {
        "relay_us_per_token": round(relay, 2),
        "protobuf_parse_us_per_message": round(1e6 * (time.process_time() - t0) / (reps * len(raw)), 3),
        "asgi_messages_per_stream": round(send.messages / (reps + 5), 2),  # head, events, [DONE]
    }


async def grpc_read_us_per_message(tokens: int, streams: int, concurrency: int) -> float:
    """CPU per message of a bare grpc.aio client reading streams from a zero-cost
    simulated worker: the floor a Python relay on grpcio pays before any work of its own."""
    async with launch.fleet("process", 1, launch.ZERO_COST) as fleet:
        target = Target("http://unused", fleet.urls, "m", tokens)
        try:
            ids = list(range(1000, 1128))
            await target.direct(ids, True)
            t0, count = time.process_time(), 0
            for _ in range(max(1, streams // concurrency)):
                done = await asyncio.gather(*(target.direct(ids, True) for _ in range(concurrency)))
                count += sum(t.tokens for t in done)
            return 1e6 * (time.process_time() - t0) / max(1, count)
        finally:
            await target.close()


async def h2_read_us_per_message(tokens: int, streams: int, concurrency: int, *, calls_c1: int = 0) -> dict[str, float]:
    """The same floors for the gateway's own HTTP/2 reader (``workers/h2``, what
    ``--worker-stream-transport h2`` uses): CPU per message at ``concurrency`` streams, and
    with ``calls_c1`` the CPU and p50 wall time of one call at a time."""
    from gateway.workers.h2 import H2Channel

    async with launch.fleet("process", 1, launch.ZERO_COST) as fleet:
        host, _, port = fleet.urls[0].removeprefix("grpc://").rpartition(":")
        channel = H2Channel(host, int(port), f"{host}:{port}")

        async def one(ids: list[int], n: int) -> int:
            request = pb.GenerateRequest(
                request_id=uuid.uuid4().hex, tokenized=pb.TokenizedInput(input_ids=ids),
                sampling_params=pb.SamplingParams(temperature=0.0, n=1, max_new_tokens=n, ignore_eos=True), stream=True,
            )  # fmt: skip
            call = channel.unary_stream(
                "/sglang.grpc.scheduler.SglangScheduler/Generate", request.SerializeToString(), pb.GenerateResponse.FromString, timeout=60,
            )  # fmt: skip
            return sum([1 async for _ in call])

        try:
            ids = list(range(1000, 1128))
            await one(ids, tokens)
            t0, count = time.process_time(), 0
            for _ in range(max(1, streams // concurrency)):
                count += sum(await asyncio.gather(*(one(ids, tokens) for _ in range(concurrency))))
            out = {"read_us_per_message": round(1e6 * (time.process_time() - t0) / max(1, count), 1)}
            if calls_c1:
                short = list(range(1000, 1032))
                for _ in range(20):
                    await one(short, 8)
                walls: list[float] = []
                t0 = time.process_time()
                for _ in range(calls_c1):
                    w0 = time.perf_counter()
                    await one(short, 8)
                    walls.append((time.perf_counter() - w0) * 1e3)
                out["cpu_ms_per_call_c1"] = round(1e3 * (time.process_time() - t0) / calls_c1, 3)
                out["p50_ms_c1"] = round(pct(walls, 0.5), 3)
            return out
        finally:
            await channel.close()


async def grpc_call_c1(tokens: int, calls: int) -> dict[str, float]:
    """One Generate call at a time from a bare grpc.aio client to a zero-cost worker
    (``tokens`` streamed): its CPU per call and its p50 wall time, the floor under the
    gateway's added latency at concurrency 1 (every call pays the poller-thread hand-offs)."""
    async with launch.fleet("process", 1, launch.ZERO_COST) as fleet:
        target = Target("http://unused", fleet.urls, "m", tokens)
        try:
            ids = list(range(1000, 1032))
            for _ in range(20):
                await target.direct(ids, True)
            walls: list[float] = []
            t0 = time.process_time()
            for _ in range(calls):
                walls.append((await target.direct(ids, True)).total_s * 1e3)
            cpu_ms = 1e3 * (time.process_time() - t0) / calls
            return {"cpu_ms_per_call": round(cpu_ms, 3), "p50_ms": round(pct(walls, 0.5), 3)}
        finally:
            await target.close()


_SSE_SERVER = """
import asyncio, sys, uvicorn, uvloop
EVENT = b'data: {"id":"cmpl-0123456789abcdef","object":"text_completion","created":1,"model":"m","choices":[{"index":0,"text":" word","logprobs":null,"finish_reason":null}]}\\\\n\\\\n'
N = int(sys.argv[2])
async def app(scope, receive, send):
    if scope["type"] != "http":
        return
    await receive()
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]})
    for _ in range(N):  # one event per loop turn, as a relay that gets one worker message per turn
        await send({"type": "http.response.body", "body": EVENT, "more_body": True})
        await asyncio.sleep(0)
    await send({"type": "http.response.body", "body": b"", "more_body": False})
uvloop.install()
uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning", access_log=False, http="httptools", loop="none", lifespan="off")
"""


async def http_write_us_per_event(tokens: int, streams: int, concurrency: int) -> float:
    """CPU per SSE event of a bare uvicorn (httptools, uvloop) ASGI app writing one event
    per send and per loop turn: the floor of the HTTP side, without Starlette, FastAPI or
    any gateway code."""
    import aiohttp

    from gateway_lab.bench.ports import free_port

    port = free_port()
    proc = await asyncio.create_subprocess_exec(sys.executable, "-c", _SSE_SERVER, str(port), str(tokens))
    try:
        async with aiohttp.ClientSession() as session:
            for _ in range(100):
                with contextlib.suppress(aiohttp.ClientError):
                    async with session.get(f"http://127.0.0.1:{port}/") as r:
                        await r.read()
                        break
                await asyncio.sleep(0.1)

            async def one() -> None:
                async with session.get(f"http://127.0.0.1:{port}/") as r:
                    async for _ in r.content:
                        pass

            c0 = cpu_seconds(proc.pid)
            for _ in range(max(1, streams // concurrency)):
                await asyncio.gather(*(one() for _ in range(concurrency)))
            return 1e6 * (cpu_seconds(proc.pid) - c0) / (max(1, streams // concurrency) * concurrency * tokens)
    finally:
        proc.terminate()
        await proc.wait()


async def relay_section(prompts: Prompts, args: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {}
    out["relay_code_us_per_token"] = [await relay_code_us_per_token(prompts, 128, 100) for _ in range(3)]
    out["chat_relay_code_us_per_token"] = [await relay_code_us_per_token(prompts, 128, 100, chat=True) for _ in range(3)]
    out["grpc_aio_read_us_per_message"] = [round(await grpc_read_us_per_message(128, 64, 16), 1) for _ in range(3)]
    out["h2_reader"] = [await h2_read_us_per_message(128, 64, 16, calls_c1=300) for _ in range(3)]
    out["uvicorn_write_us_per_event"] = [round(await http_write_us_per_event(128, 64, 16), 1) for _ in range(3)]
    out["grpc_aio_call_c1"] = [await grpc_call_c1(8, 300) for _ in range(3)]
    return out


# ---------------------------------------------------------------- start: a request's fixed part, in process


class _MemoryCall:
    """A worker's Generate as already-serialized messages: ``tokens`` one-token chunks, then
    the complete (parsed on read, as gRPC's deserializer does; one loop turn per read)."""

    def __init__(self, request: pb.GenerateRequest, tokens: int, cached: int) -> None:
        n = len(request.tokenized.input_ids)
        request.SerializeToString()  # what the real call's send pays
        ids = list(range(1000, 1000 + tokens))
        messages = [
            pb.GenerateResponse(chunk=pb.GenerateStreamChunk(
                token_ids=[t], prompt_tokens=n, completion_tokens=i + 1, cached_tokens=cached,
            ))
            for i, t in enumerate(ids)
        ]  # fmt: skip
        messages.append(pb.GenerateResponse(complete=pb.GenerateComplete(
            output_ids=ids[-1:], finish_reason="length", prompt_tokens=n, completion_tokens=tokens, cached_tokens=cached,
        )))  # fmt: skip
        self._raw = collections.deque(m.SerializeToString() for m in messages)

    async def read(self) -> Any:
        await asyncio.sleep(0)
        if not self._raw:
            return END_OF_STREAM
        return pb.GenerateResponse.FromString(self._raw.popleft())

    def cancel(self) -> bool:
        return False

    def ready(self) -> bool:
        return False  # one loop turn per read, as a grpc.aio call


async def _gated(gate: asyncio.Semaphore, work: Awaitable[None]) -> None:
    async with gate:
        await work


def _thread_cpu() -> dict[str, tuple[str, float]]:
    """CPU seconds of each thread of this process, from /proc (task id -> (name, seconds))."""
    out: dict[str, tuple[str, float]] = {}
    tick = os.sysconf("SC_CLK_TCK")
    for task in os.listdir("/proc/self/task"):
        with contextlib.suppress(OSError):
            stat = Path(f"/proc/self/task/{task}/stat").read_text()
            name = "event loop" if task == str(os.getpid()) else Path(f"/proc/self/task/{task}/comm").read_text().strip()
            fields = stat[stat.rindex(")") + 2 :].split()
            out[task] = (name, (int(fields[11]) + int(fields[12])) / tick)
    return out


async def start_section(args: argparse.Namespace) -> dict[str, Any]:
    """See the module doc (``start``)."""
    import logging

    from gateway.server.config import GatewayConfig
    from gateway.server.gc_policy import tune_gc
    from gateway.server.http.app import create_app
    from gateway.server.state import GatewayState
    from gateway_lab.bench.workloads import GspConfig, Vocab, gsp

    logging.getLogger().setLevel(logging.WARNING)  # as the compare section's gateways run
    vocab = Vocab.from_tokenizer_dir()
    bursts = [
        [s.prompt or "" for s in gsp(GspConfig(
            groups=args.gsp_groups, prompts_per_group=args.gsp_prompts_per_group, system_tokens=args.gsp_system_tokens,
            question_tokens=args.gsp_question_tokens, output_tokens=args.gsp_output_tokens, text_prompts=True,
        ), vocab, args.seed + b)]
        for b in range(args.start_bursts + 1)
    ]  # fmt: skip
    cached = args.gsp_system_tokens  # what a worker holding the group's system prompt reports
    async with launch.fleet("process", args.gsp_workers, _sim_config(args)) as fleet:
        config = GatewayConfig()
        config.server.worker_urls = list(fleet.urls)
        config.server.tokenizer_path = str(default_tokenizer_dir())
        config.policy.policy = args.policy
        state = GatewayState(config)
        app = create_app(state, manage_lifecycle=False)
        await state.start()
        try:
            for worker in state.registry.all():
                worker.client.generate = (  # type: ignore[method-assign]
                    lambda request, timeout=None: _MemoryCall(request, args.gsp_output_tokens, cached)  # type: ignore[misc]
                )
            entry = state.catalog.get(None)
            statuses: collections.Counter[int] = collections.Counter()

            async def one(prompt: str) -> None:
                body = orjson.dumps({"model": entry.name, "prompt": prompt, "max_tokens": args.gsp_output_tokens, "stream": True})
                done = asyncio.Event()
                sent = False

                async def receive() -> dict[str, Any]:
                    nonlocal sent
                    if not sent:
                        sent = True
                        return {"type": "http.request", "body": body, "more_body": False}
                    await done.wait()
                    return {"type": "http.disconnect"}

                async def send(message: dict[str, Any]) -> None:
                    if message["type"] == "http.response.start":
                        statuses[message["status"]] += 1
                    elif not message.get("more_body", False):
                        done.set()

                scope = {
                    "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
                    "path": "/v1/completions", "raw_path": b"/v1/completions", "query_string": b"", "root_path": "",
                    "headers": [(b"host", b"127.0.0.1"), (b"content-type", b"application/json"),
                                (b"content-length", str(len(body)).encode())],
                    "client": ("127.0.0.1", 50000), "server": ("127.0.0.1", 8000), "state": {},
                }  # fmt: skip
                await app(scope, receive, send)  # type: ignore[arg-type]

            # Warm: the model's fast encoder (built once per process), then one burst.
            await asyncio.to_thread(lambda: entry.tokenizer.fast_bpe)
            await asyncio.gather(*(one(p) for p in bursts[0]))
            tune_gc(config.server.gc_young_threshold)  # as serve does once it is up
            per_request: list[float] = []
            threads: dict[str, float] = collections.defaultdict(float)
            misses = 0
            for prompts in bursts[1:]:
                entry.prompt_cache.clear()
                state.router.reset_policies()
                before_misses = entry.prompt_cache.stats().misses
                gate = asyncio.Semaphore(args.gsp_concurrency)
                t0, c0 = _thread_cpu(), time.process_time()
                await asyncio.gather(*(_gated(gate, one(p)) for p in prompts))
                cpu, t1 = time.process_time() - c0, _thread_cpu()
                per_request.append(1e3 * cpu / len(prompts))
                for task, (name, seconds) in t1.items():
                    threads[name] += seconds - t0.get(task, (name, 0.0))[1]
                misses += entry.prompt_cache.stats().misses - before_misses
            n = sum(len(b) for b in bursts[1:])
            in_flight = sum(w.load.in_flight for w in state.registry.all())
            return {
                "requests": n, "bursts": len(per_request),
                "cpu_ms_per_request": round(statistics.median(per_request), 3),
                "cpu_ms_per_request_bursts": [round(v, 3) for v in per_request],
                "thread_cpu_ms_per_request": {k: round(1e3 * v / n, 3) for k, v in sorted(threads.items(), key=lambda kv: -kv[1]) if v > 0},
                "prompt_cache_misses_per_burst": round(misses / max(1, len(per_request)), 2),
                "statuses": dict(statuses), "in_flight_after": in_flight,
            }  # fmt: skip
        finally:
            await state.stop()


# ---------------------------------------------------------------- side by side: ours, SMG, a baseline

GATEWAYS = ("ours", "smg", "before")


@dataclass
class Reply:
    total_s: float
    ttft_s: float
    tokens: int
    text: str = ""
    prompt_tokens: int = 0
    cached_tokens: int = 0
    events: int = 0  # SSE events that carried text


class Client:
    """aiohttp to one gateway: the client shares the machine with the gateway under test,
    so it must cost less than what it measures (httpx costs several times the gateway's
    own CPU per short request at 128 in flight)."""

    def __init__(self, base_url: str, model: str, connections: int) -> None:
        import aiohttp

        self.base = base_url
        self.model = model
        self.session = aiohttp.ClientSession(
            # Idle connections are dropped here before a gateway's own keep-alive timeout
            # (ours: 5 s) closes them: reusing one the server is closing fails the request.
            connector=aiohttp.TCPConnector(limit=connections, force_close=False, keepalive_timeout=2.0),
            timeout=aiohttp.ClientTimeout(total=300),
            trust_env=False,
        )

    async def close(self) -> None:
        await self.session.close()

    async def send(self, path: str, body: dict[str, Any]) -> Reply:
        body = {"model": self.model, "temperature": 0.0, "ignore_eos": True, **body}
        if body.get("stream"):
            body["stream_options"] = {"include_usage": True}
        t0 = time.perf_counter()
        headers = {"content-type": "application/json"}
        async with self.session.post(self.base + path, data=orjson.dumps(body), headers=headers) as response:
            if response.status != 200:
                raise RuntimeError(f"{path}: HTTP {response.status}: {(await response.read())[:300]!r}")
            if not body.get("stream"):
                data = orjson.loads(await response.read())
                total = time.perf_counter() - t0
                choice = data["choices"][0]
                text = choice.get("text") if "text" in choice else _delta_text(choice.get("message") or {})
                tokens, prompt, cached = _usage(data.get("usage"))
                return Reply(total, total, tokens, text or "", prompt, cached)
            ttft = 0.0
            pieces: list[str] = []
            usage = None
            events = 0
            done = False
            async for line in response.content:
                if not line.startswith(b"data: "):
                    continue
                payload = line[6:].strip()
                if payload == b"[DONE]":
                    done = True
                    break
                chunk = orjson.loads(payload)
                if "error" in chunk:
                    raise RuntimeError(f"{path}: stream error {chunk['error']}")
                for c in chunk.get("choices") or ():
                    piece = c.get("text") if "text" in c else _delta_text(c.get("delta") or {})
                    if piece:
                        if not ttft:
                            ttft = time.perf_counter() - t0
                        pieces.append(piece)
                        events += 1
                if chunk.get("usage"):
                    usage = chunk["usage"]
            if not done:
                raise RuntimeError(f"{path}: stream ended without [DONE]")
            total = time.perf_counter() - t0
            tokens, prompt, cached = _usage(usage)
            return Reply(total, ttft or total, tokens, "".join(pieces), prompt, cached, events)


def _delta_text(message: dict[str, Any]) -> str:
    """Content and reasoning alike: a peer that parses reasoning by default (SMG with
    Qwen3) puts the text there, and the next turn's history must carry the same text."""
    return (message.get("reasoning_content") or "") + (message.get("content") or "")


def _usage(usage: dict[str, Any] | None) -> tuple[int, int, int]:
    if not usage:
        return 0, 0, 0
    details = usage.get("prompt_tokens_details") or {}
    return int(usage.get("completion_tokens") or 0), int(usage.get("prompt_tokens") or 0), int(details.get("cached_tokens") or 0)


class RawHttp:
    """The cheapest HTTP client on this side: HTTP/1.1 keep-alive on one blocking socket,
    pre-built request bytes out, the answer read to its Content-Length or, streamed, to the
    chunked body's end (TTFT at the first event carrying text). At concurrency 1 nothing
    else runs on the bench's event loop, so blocking it costs nothing; what aiohttp spends
    per request (parsing, futures, its own loop wake-ups) is not in these figures."""

    _TEXT = re.compile(rb'"(?:content|reasoning_content|text)":"[^"]')

    def __init__(self, url: str) -> None:
        host, _, port = url.removeprefix("http://").partition(":")
        self.host = host
        self.sock = socket.create_connection((host, int(port)))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf = b""

    def close(self) -> None:
        self.sock.close()

    def request(self, path: str, body: bytes) -> bytes:
        return (
            f"POST {path} HTTP/1.1\r\nhost: {self.host}\r\ncontent-type: application/json\r\n"
            f"content-length: {len(body)}\r\n\r\n"
        ).encode() + body

    def _fill(self) -> None:
        data = self.sock.recv(65536)
        if not data:
            raise RuntimeError("raw client: the server closed the connection")
        self.buf += data

    def roundtrip(self, raw: bytes) -> tuple[float, float]:
        """(total s, ttft s) of one request; raises on anything but a 200."""
        t0 = time.perf_counter()
        self.sock.sendall(raw)
        while b"\r\n\r\n" not in self.buf:
            self._fill()
        head, _, self.buf = self.buf.partition(b"\r\n\r\n")
        headers = {}
        for line in head.split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            headers[name.strip().lower()] = value.strip()
        ttft = 0.0
        if b"content-length" in headers:
            length = int(headers[b"content-length"])
            while len(self.buf) < length:
                self._fill()
            body, self.buf = self.buf[:length], self.buf[length:]
        else:  # chunked: size line, data, CRLF ... a zero-size chunk ends it
            parts: list[bytes] = []
            while True:
                while b"\r\n" not in self.buf:
                    self._fill()
                size_line, _, self.buf = self.buf.partition(b"\r\n")
                size = int(size_line.split(b";")[0], 16)
                while len(self.buf) < size + 2:
                    self._fill()
                part, self.buf = self.buf[:size], self.buf[size + 2 :]
                if size == 0:
                    break
                if not ttft and self._TEXT.search(part):
                    ttft = time.perf_counter() - t0
                parts.append(part)
            body = b"".join(parts)
        total = time.perf_counter() - t0
        if not head.startswith(b"HTTP/1.1 200"):
            raise RuntimeError(f"raw client: {head[:40]!r}: {body[:300]!r}")
        if b"[DONE]" not in body and b"content-length" not in headers:
            raise RuntimeError("raw client: stream ended without [DONE]")
        return total, ttft or total


class SyncDirect:
    """grpcio's synchronous stub, called from this thread: the other direct caller (beside
    ``Target.direct``'s grpc.aio), so the cheaper of the two is known and used."""

    def __init__(self, worker_urls: Sequence[str]) -> None:
        self.channels = [grpc.insecure_channel(u.removeprefix("grpc://")) for u in worker_urls]
        self.stubs = [pb_grpc.SglangSchedulerStub(c) for c in self.channels]
        self._next = itertools.count()

    def close(self) -> None:
        for c in self.channels:
            c.close()

    def call(self, ids: list[int], stream: bool, max_tokens: int) -> tuple[float, float]:
        stub = self.stubs[next(self._next) % len(self.stubs)]
        request = pb.GenerateRequest(
            request_id=uuid.uuid4().hex, tokenized=pb.TokenizedInput(input_ids=ids),
            sampling_params=pb.SamplingParams(temperature=0.0, n=1, max_new_tokens=max_tokens, ignore_eos=True),
            stream=stream,
        )  # fmt: skip
        t0 = time.perf_counter()
        ttft = 0.0
        for message in stub.Generate(request, timeout=60):
            if not ttft and message.HasField("chunk"):
                ttft = time.perf_counter() - t0
        total = time.perf_counter() - t0
        return total, ttft or total


async def raw_c1(gw: launch.Gateway, direct: Target, model: str, prompts: Prompts, args: argparse.Namespace, stream: bool) -> dict[str, Any]:
    """One at a time with the cheapest client on each side: ``RawHttp`` to the gateway,
    against the same prompt ids sent straight to a worker by grpc.aio and by the sync stub
    (rotating order); added = gateway minus the faster direct caller at each percentile.
    The blocking calls block this event loop, which has nothing else to do meanwhile."""
    http = RawHttp(gw.url)
    sync = SyncDirect(direct.worker_urls)
    gw_t: list[tuple[float, float]] = []
    by: dict[str, list[tuple[float, float]]] = {"sync": [], "aio": []}

    def body(messages: list[dict[str, str]]) -> bytes:
        one: dict[str, Any] = {
            "model": model, "messages": messages, "max_tokens": args.short_max_tokens,
            "temperature": 0.0, "ignore_eos": True, "stream": stream,
        }  # fmt: skip
        if stream:
            one["stream_options"] = {"include_usage": True}
        return http.request("/v1/chat/completions", orjson.dumps(one))

    async def aio(ids: list[int]) -> tuple[float, float]:
        t = await direct.direct(ids, stream, args.short_max_tokens)
        return t.total_s, t.ttft_s

    try:
        for _ in range(10):  # warm: connections, first-use costs
            messages, ids = prompts.make(args.short_prompt_tokens)
            http.roundtrip(body(messages))
            sync.call(ids, stream, args.short_max_tokens)
            await aio(ids)
        c0 = cpu_seconds(gw.pid)
        deadline = time.perf_counter() + args.cap_s
        for i in range(args.latency_requests):
            if time.perf_counter() > deadline:
                break
            messages, ids = prompts.make(args.short_prompt_tokens)
            raw = body(messages)
            for k in range(3):  # rotate who goes first
                which = (i + k) % 3
                if which == 0:
                    gw_t.append(http.roundtrip(raw))
                elif which == 1:
                    by["sync"].append(sync.call(ids, stream, args.short_max_tokens))
                else:
                    by["aio"].append(await aio(ids))
        cpu = cpu_seconds(gw.pid) - c0
    finally:
        http.close()
        sync.close()
    col = 1 if stream else 0
    g = [t[col] * 1e3 for t in gw_t]
    d = {k: [t[col] * 1e3 for t in v] for k, v in by.items()}
    best = min(d, key=lambda k: pct(d[k], 0.5))
    row: dict[str, Any] = {
        "requests": len(gw_t), "cpu_ms_per_request": round(1e3 * cpu / max(1, len(gw_t)), 3),
        "gateway_p50_ms": round(pct(g, 0.5), 3), "direct_sync_p50_ms": round(pct(d["sync"], 0.5), 3),
        "direct_aio_p50_ms": round(pct(d["aio"], 0.5), 3), "direct": best,
        "added_p50_ms": round(pct(g, 0.5) - pct(d[best], 0.5), 3),
        "added_p99_ms": round(pct(g, 0.99) - pct(d[best], 0.99), 3),
    }  # fmt: skip
    if stream:
        row["total_gateway_p50_ms"] = round(pct([t[0] * 1e3 for t in gw_t], 0.5), 3)
    return row


def start_gateway(name: str, urls: Sequence[str], args: argparse.Namespace) -> contextlib.AbstractAsyncContextManager[launch.Gateway]:
    """Gateway ``name`` (ours, smg, or ``before``: ours from ``--baseline-src``) over ``urls``."""
    if name == "smg":
        return launch.gateway("smg", urls, args.policy, peers_python=args.peers_python)
    env = dict(os.environ, PYTHONPATH=args.baseline_src) if name == "before" else None
    extra = ["--log-level", "warning", "--tokenizer-path", str(default_tokenizer_dir())]
    if name == "ours":
        extra += shlex.split(args.ours_args)
    if getattr(args, "door", "http") == "grpc":
        extra += ["--grpc-port", "0"]  # the gRPC front door, its address in the ready info
    return launch.gateway("ours", urls, args.policy, extra_args=extra, env=env)


async def flush_caches(urls: Sequence[str]) -> None:
    """Empty every simulated worker's KV cache, so each gateway starts on cold caches."""
    from gateway.workers.registry import grpc_connect

    for url in urls:
        client = grpc_connect(url, None, None)  # gRPC or SGLang HTTP, by the URL's scheme
        try:
            await client.flush_cache(2.0)
        finally:
            await client.close()


async def idle_cpu(pid: int, seconds: float) -> dict[str, Any]:
    """CPU the gateway burns with its workers registered and no traffic (polls, probes, timers)."""
    await asyncio.sleep(1.0)  # let start-up work settle
    t0, c0 = time.perf_counter(), cpu_seconds(pid)
    await asyncio.sleep(seconds)
    spent = cpu_seconds(pid) - c0
    return {"idle_core_percent": round(100 * spent / (time.perf_counter() - t0), 2)}


async def warm_long_prompt(gw: launch.Gateway, client: Client, args: argparse.Namespace, *, chat: bool) -> None:
    """One long prompt of words no measured prompt uses, then wait until the gateway is
    quiet: what a gateway does once per process at its first long prompt (ours builds its
    fast encoder: seconds of CPU) is not part of the loads it meets
    after running a while. Every gateway gets the same prompt."""
    from gateway_lab.bench.workloads import GspConfig, Vocab, gsp

    sizes = GspConfig(groups=1, prompts_per_group=1, system_tokens=2048, question_tokens=128, text_prompts=True)
    text = next(iter(gsp(sizes, Vocab.from_tokenizer_dir(), args.seed + 7919))).prompt or ""
    if chat:
        await client.send("/v1/chat/completions", {"messages": [{"role": "user", "content": text}], "max_tokens": 1, "stream": True})
    else:
        await client.send("/v1/completions", {"prompt": text, "max_tokens": 1, "stream": True})
    await settle(gw.pid, args.cap_s)


async def warm_short_prompts(gw: launch.Gateway, client: Client, prompts: Prompts, args: argparse.Namespace) -> None:
    """``--short-warm`` short chats (8 in flight, prompts no measured request uses), then wait
    until the gateway is quiet: ours builds a model's fast encoder at its 256th prompt
    (``--fast-encoder-after``, seconds of CPU once per process), which is not part of what a short
    request costs a gateway that has served a while. Every gateway gets the same warm-up."""
    if args.short_warm <= 0:
        return
    warm = [prompts.messages(args.short_prompt_tokens) for _ in range(args.short_warm)]
    body = {"max_tokens": args.short_max_tokens}
    await closed_loop(lambda i: client.send("/v1/chat/completions", {**body, "messages": warm[i]}), 8, len(warm), args.cap_s)  # type: ignore[arg-type,return-value]
    await settle(gw.pid, args.cap_s)


async def settle(pid: int, cap_s: float, quiet_cpu_s: float = 0.02, window_s: float = 0.5) -> None:
    """Wait (at most ``cap_s``) until process ``pid`` uses under ``quiet_cpu_s`` of CPU in ``window_s``."""
    deadline = time.perf_counter() + cap_s
    while time.perf_counter() < deadline:
        c0 = cpu_seconds(pid)
        await asyncio.sleep(window_s)
        if cpu_seconds(pid) - c0 < quiet_cpu_s:
            return


async def timed_loop(
    call: Callable[[int], Awaitable[Reply]], concurrency: int, requests: int, cap_s: float, pid: int
) -> tuple[list[Reply], float, float]:
    c0 = cpu_seconds(pid)
    done, wall = await closed_loop(call, concurrency, requests, cap_s)  # type: ignore[arg-type]
    return done, wall, cpu_seconds(pid) - c0  # type: ignore[return-value]


def _cpu_row(done: Sequence[Reply], wall: float, cpu: float) -> dict[str, Any]:
    tokens = sum(r.tokens for r in done)
    lat = [r.total_s * 1e3 for r in done]
    ttft = [r.ttft_s * 1e3 for r in done]
    return {
        "requests": len(done), "seconds": round(wall, 2), "requests_per_s": round(len(done) / wall, 1),
        "cpu_ms_per_request": round(1e3 * cpu / max(1, len(done)), 3),
        "cpu_us_per_token": round(1e6 * cpu / max(1, tokens), 1),
        "latency_p50_ms": round(pct(lat, 0.5), 2), "latency_p99_ms": round(pct(lat, 0.99), 2),
        "ttft_p50_ms": round(pct(ttft, 0.5), 2), "ttft_p99_ms": round(pct(ttft, 0.99), 2),
        "core_share": round(cpu / wall, 2),
        "tokens_per_event": round(tokens / max(1, sum(r.events for r in done)), 2) if any(r.events for r in done) else None,
    }  # fmt: skip


async def short_loads(gw: launch.Gateway, client: Client, direct: Target, prompts: Prompts, args: argparse.Namespace) -> dict[str, Any]:
    """Short chat: 128 in flight non-streaming, then one at a time against direct gRPC."""
    out: dict[str, Any] = {}
    pool = [prompts.messages(args.short_prompt_tokens) for _ in range(min(args.short_requests, 2048))]
    body = {"max_tokens": args.short_max_tokens}
    await client.send("/v1/chat/completions", {**body, "messages": pool[0]})  # warm
    await warm_short_prompts(gw, client, prompts, args)
    done, wall, cpu = await timed_loop(
        lambda i: client.send("/v1/chat/completions", {**body, "messages": pool[i % len(pool)]}),
        args.short_concurrency, args.short_requests, args.cap_s, gw.pid,
    )  # fmt: skip
    out["short"] = _cpu_row(done, wall, cpu)
    for stream in (False, True):
        gw_t: list[Reply] = []
        direct_t: list[Timing] = []
        c0 = cpu_seconds(gw.pid)
        deadline = time.perf_counter() + args.cap_s
        for i in range(args.latency_requests):
            if time.perf_counter() > deadline:
                break
            messages, ids = prompts.make(args.short_prompt_tokens)
            one = {**body, "messages": messages, "stream": stream}
            if i % 2 == 0:
                gw_t.append(await client.send("/v1/chat/completions", one))
                direct_t.append(await direct.direct(ids, stream, args.short_max_tokens))
            else:
                direct_t.append(await direct.direct(ids, stream, args.short_max_tokens))
                gw_t.append(await client.send("/v1/chat/completions", one))
        cpu = cpu_seconds(gw.pid) - c0
        g = [t.total_s * 1e3 for t in gw_t]
        d = [t.total_s * 1e3 for t in direct_t]
        row: dict[str, Any] = {
            "requests": len(gw_t), "cpu_ms_per_request": round(1e3 * cpu / max(1, len(gw_t)), 3),
            "added_p50_ms": round(pct(g, 0.5) - pct(d, 0.5), 3), "added_p99_ms": round(pct(g, 0.99) - pct(d, 0.99), 3),
            "gateway_p50_ms": round(pct(g, 0.5), 3), "direct_p50_ms": round(pct(d, 0.5), 3),
        }  # fmt: skip
        if stream:
            gt = [t.ttft_s * 1e3 for t in gw_t]
            dt = [t.ttft_s * 1e3 for t in direct_t]
            row |= {
                "ttft_p50_ms": round(pct(gt, 0.5), 3), "ttft_added_p50_ms": round(pct(gt, 0.5) - pct(dt, 0.5), 3),
                "ttft_added_p99_ms": round(pct(gt, 0.99) - pct(dt, 0.99), 3),
            }  # fmt: skip
        out["c1-stream" if stream else "c1"] = row
    for stream in (False, True):
        out["c1-raw-stream" if stream else "c1-raw"] = await raw_c1(gw, direct, client.model, prompts, args, stream)
    return out


async def multi_turn_load(gw: launch.Gateway, client: Client, args: argparse.Namespace) -> dict[str, Any]:
    """C conversations x T turns, each turn resending the history, ``--chat-concurrency`` in flight."""
    from gateway_lab.bench.workloads import ChatConfig, Vocab, multi_turn_chat

    config = ChatConfig(
        conversations=args.chat_conversations, turns=args.chat_turns, chat_system_tokens=args.chat_system_tokens,
        user_tokens=args.chat_user_tokens, reply_tokens=args.chat_reply_tokens,
    )  # fmt: skip
    workload = multi_turn_chat(config, Vocab.from_tokenizer_dir(), args.seed)
    lanes: dict[str, list[Any]] = {}
    for spec in workload:
        lanes.setdefault(spec.conversation or "", []).append(spec)
    gate = asyncio.Semaphore(args.chat_concurrency)
    done: list[Reply] = []

    async def lane(specs: list[Any]) -> None:
        history: list[dict[str, str]] = []
        for spec in sorted(specs, key=lambda s: s.turn):
            messages = [*history, *(dict(m) for m in spec.messages)]
            async with gate:
                reply = await client.send("/v1/chat/completions", {"messages": messages, "max_tokens": spec.max_tokens, "stream": True})
            done.append(reply)
            history = [*messages, {"role": "assistant", "content": reply.text}]

    await warm_long_prompt(gw, client, args, chat=True)
    c0, t0 = cpu_seconds(gw.pid), time.perf_counter()
    await asyncio.wait_for(asyncio.gather(*(lane(s) for s in lanes.values())), timeout=args.cap_s + 300)
    wall, cpu = time.perf_counter() - t0, cpu_seconds(gw.pid) - c0
    row = _cpu_row(done, wall, cpu)
    prompt = sum(r.prompt_tokens for r in done)
    row["hit_rate"] = round(sum(r.cached_tokens for r in done) / max(1, prompt), 3)
    row["prompt_tokens_max"] = max((r.prompt_tokens for r in done), default=0)
    return row


async def gsp_load(gw: launch.Gateway, client: Client, args: argparse.Namespace, *, warm: bool = True) -> dict[str, Any]:
    """The shared-prefix burst with text prompts (the peer takes no token-id prompts), streamed
    (``warm=False``: the caller ran ``warm_long_prompt`` already, outside a profile)."""
    from gateway_lab.bench.workloads import GspConfig, Vocab, gsp

    config = GspConfig(
        groups=args.gsp_groups, prompts_per_group=args.gsp_prompts_per_group, system_tokens=args.gsp_system_tokens,
        question_tokens=args.gsp_question_tokens, output_tokens=args.gsp_output_tokens, text_prompts=True,
    )  # fmt: skip
    specs = list(gsp(config, Vocab.from_tokenizer_dir(), args.seed))
    if warm:
        await warm_long_prompt(gw, client, args, chat=False)
    done, wall, cpu = await timed_loop(
        lambda i: client.send("/v1/completions", {"prompt": specs[i].prompt, "max_tokens": specs[i].max_tokens, "stream": True}),
        args.gsp_concurrency, len(specs), args.cap_s + 300, gw.pid,
    )  # fmt: skip
    row = _cpu_row(done, wall, cpu)
    row["hit_rate"] = round(sum(r.cached_tokens for r in done) / max(1, sum(r.prompt_tokens for r in done)), 3)
    return row


def _sim_config(args: argparse.Namespace) -> SimConfig:
    """Zero-cost workers (every step free: the gateway is the bottleneck), or with
    ``--worker-step-s`` workers whose every step takes that long in real time, as a GPU's
    decode step does: tokens then come at the workers' pace and a gateway keeps up."""
    step = args.worker_step_s
    return SimConfig(
        step_base_s=step, prefill_token_s=0.0, decode_seq_s=0.0, time_scale=1.0 if step > 0 else 0.0,
        context_length=args.context_length, kv_capacity_tokens=max(65536, 4 * args.context_length),
        max_running_requests=256,
    )  # fmt: skip


async def compare_fleet(
    workers: int, loads: Sequence[str], gateways: Sequence[str], args: argparse.Namespace, prompts: Prompts,
    prof: Path | None, rep: int,
) -> list[dict[str, Any]]:
    """Every gateway in turn on one fleet (caches flushed in between), the same loads each."""
    rows: list[dict[str, Any]] = []
    async with launch.fleet("process", workers, _sim_config(args)) as fleet:
        for name in gateways:
            await flush_caches(fleet.urls)
            async with start_gateway(name, fleet.urls, args) as gw:
                async with httpx.AsyncClient(trust_env=False) as probe:
                    model = (await probe.get(gw.url + "/v1/models")).json()["data"][0]["id"]
                connections = max(args.short_concurrency, args.gsp_concurrency, args.chat_concurrency)
                client = Client(gw.url, model, connections)
                direct = Target(gw.url, fleet.urls, model, args.short_max_tokens)
                try:
                    row: dict[str, Any] = {"gateway": name, "workers": workers, "rep": rep}
                    row |= await idle_cpu(gw.pid, args.idle_s)
                    for load in loads:
                        spy = prof / f"{name}-{load}-w{workers}-r{rep}.txt" if prof and name != "smg" else None
                        if load == "gsp":  # the one-off warm-up (our encoder's build) stays out of the profile
                            await warm_long_prompt(gw, client, args, chat=False)
                        with profiling(gw.pid, spy, args.profile_rate, args.profile_gil):
                            if load == "short":
                                row |= {k: v for k, v in (await short_loads(gw, client, direct, prompts, args)).items()}
                            elif load == "multi-turn":
                                row["multi-turn"] = await multi_turn_load(gw, client, args)
                            elif load == "gsp":
                                row["gsp"] = await gsp_load(gw, client, args, warm=False)
                    rows.append(row)
                    show(f"{name}, {workers} workers, rep {rep}", {k: v for k, v in row.items() if not isinstance(v, dict)})
                    for key, value in row.items():
                        if isinstance(value, dict):
                            show(f"  {name} {key}", value)
                finally:
                    await client.close()
                    await direct.close()
    return rows


COMPARE_FIGURES = [
    ("short", "requests_per_s", "short, 128 in flight: requests/s"),
    ("short", "cpu_ms_per_request", "short, 128 in flight: CPU ms/request"),
    ("c1", "cpu_ms_per_request", "short, one at a time: CPU ms/request"),
    ("c1", "added_p50_ms", "short, one at a time: added p50 ms"),
    ("c1", "added_p99_ms", "short, one at a time: added p99 ms"),
    ("c1-stream", "ttft_added_p50_ms", "short streamed, one at a time: added TTFT p50 ms"),
    ("c1-stream", "ttft_p50_ms", "short streamed, one at a time: TTFT p50 ms"),
    ("c1-raw", "added_p50_ms", "short, one at a time, cheapest clients: added p50 ms"),
    ("c1-raw", "added_p99_ms", "short, one at a time, cheapest clients: added p99 ms"),
    ("c1-raw", "gateway_p50_ms", "short, one at a time, cheapest clients: gateway p50 ms"),
    ("c1-raw", "direct_sync_p50_ms", "short, one at a time: direct gRPC p50 ms, sync stub"),
    ("c1-raw", "direct_aio_p50_ms", "short, one at a time: direct gRPC p50 ms, grpc.aio"),
    ("c1-raw-stream", "added_p50_ms", "short streamed, one at a time, cheapest clients: added TTFT p50 ms"),
    ("gsp", "cpu_ms_per_request", "gsp burst: CPU ms/request"),
    ("gsp", "cpu_us_per_token", "gsp burst: CPU us/relayed token"),
    ("gsp", "ttft_p50_ms", "gsp burst: TTFT p50 ms"),
    ("gsp", "seconds", "gsp burst: run s"),
    ("gsp", "hit_rate", "gsp burst: hit rate"),
    ("multi-turn", "cpu_ms_per_request", "multi-turn: CPU ms/request"),
    ("multi-turn", "core_share", "multi-turn: share of a core"),
    ("multi-turn", "hit_rate", "multi-turn: hit rate"),
]


def compare_table(rows: Sequence[dict[str, Any]], gateways: Sequence[str]) -> Table:
    """One line per figure, per gateway the median over repetitions and the range (the
    ratio is of the medians)."""
    def values(name: str, load: str, key: str) -> list[float]:
        out = []
        for row in rows:
            if row["gateway"] != name:
                continue
            src = row.get(load) if load != "idle" else row
            if isinstance(src, dict) and key in src:
                out.append(float(src[key]))
        return out

    def cell(v: list[float]) -> str:
        if not v:
            return "-"
        med = round(statistics.median(v), 3)
        return f"{med:g}" if len(v) == 1 else f"{med:g} ({min(v):g}-{max(v):g})"

    figures = [("idle", "idle_core_percent", f"idle, % of a core ({w} workers)") for w in sorted({r['workers'] for r in rows})]
    both = {"ours", "smg"} <= set(gateways)
    lines: list[list[str]] = []
    for load, key, label in figures[:0] + COMPARE_FIGURES + figures:
        per = {g: values(g, load, key) for g in gateways}
        if load == "idle":
            w = int(label.split("(")[1].split()[0])
            per = {g: [float(r["idle_core_percent"]) for r in rows if r["gateway"] == g and r["workers"] == w] for g in gateways}
        if not any(per.values()):
            continue
        line = [label, *(cell(per[g]) for g in gateways)]
        if both:
            o, s = per["ours"], per["smg"]
            line.append(f"{statistics.median(o) / statistics.median(s):.2f}x" if o and s and statistics.median(s) else "-")
        lines.append(line)
    header = ["figure", *gateways, *(["ours / smg"] if both else [])]
    return Table.of("gateways side by side", header, lines, labels=1)


def round_order(gateways: Sequence[str], rep: int) -> list[str]:
    """The gateways of round ``rep`` in their turn: as listed in odd rounds, reversed in even
    ones, so that on a shared host what runs first (or last) is not always the same gateway."""
    return list(gateways) if rep % 2 else list(reversed(gateways))


async def compare(args: argparse.Namespace, prompts: Prompts, prof: Path | None) -> dict[str, Any]:
    gateways = [g for g in args.gateways if g != "smg" or args.peers_installed]
    if "smg" in args.gateways and "smg" not in gateways:
        print(f"smg skipped: no peers' python at {args.peers_python} (scripts/peers.sh installs it)", flush=True)
    if "before" in gateways and not args.baseline_src:
        raise SystemExit("--gateways before needs --baseline-src DIR (another checkout's src/)")
    loads = set(args.loads)
    rows: list[dict[str, Any]] = []
    for rep in range(1, args.repeat + 1):
        order = round_order(gateways, rep)
        if loads & {"short", "multi-turn"}:
            rows += await compare_fleet(
                args.short_workers, [x for x in ("short", "multi-turn") if x in loads], order, args, prompts, prof, rep
            )
        if "gsp" in loads:
            rows += await compare_fleet(args.gsp_workers, ["gsp"], order, args, prompts, prof, rep)
    return {"rows": rows, "gateways": gateways, "table": "\n".join(compare_table(rows, gateways).markdown())}


# ---------------------------------------------------------------- orchestration


@dataclass
class Deployment:
    fleet: Any  # a process fleet (launch.fleet)
    gateway: launch.Gateway
    target: Target
    meter: CpuMeter


@contextlib.asynccontextmanager
async def deploy(workers: int, args: argparse.Namespace) -> AsyncIterator[Deployment]:
    sim = dataclasses.replace(
        launch.ZERO_COST, context_length=args.context_length, kv_capacity_tokens=max(65536, 4 * args.context_length),
        max_running_requests=256,
    )  # fmt: skip
    extra = ["--log-level", "warning", "--tokenizer-path", str(default_tokenizer_dir())]
    async with (
        launch.fleet("process", workers, sim) as fleet,
        launch.gateway("ours", fleet.urls, args.policy, extra_args=extra) as gateway,
    ):
        async with httpx.AsyncClient(trust_env=False) as client:
            model = (await client.get(gateway.url + "/v1/models")).json()["data"][0]["id"]
        target = Target(gateway.url, fleet.urls, model, args.max_tokens)
        first = await target.gateway(Prompts.first_chat(), False)  # what the first client waits
        show(f"first chat request after ready, {workers} workers", {"first_request_ms": round(first.total_s * 1e3, 1)})
        assert fleet.proc is not None
        meter = CpuMeter({"gateway": gateway.pid, "workers": fleet.proc.pid, "client": os.getpid()})
        try:
            yield Deployment(fleet, gateway, target, meter)
        finally:
            await target.close()


def show(title: str, row: dict[str, Any]) -> None:
    print(f"{title} ({load_note()}): " + ", ".join(f"{k}={v}" for k, v in row.items()), flush=True)


async def run(args: argparse.Namespace) -> dict[str, Any]:
    prompts = Prompts(args.seed)
    report: dict[str, Any] = {
        "date": datetime.date.today().isoformat(), "policy": args.policy,
        "argv": sys.argv[1:], "load_before": list(os.getloadavg()),
    }  # fmt: skip
    sections = set(args.sections)
    started = time.time()
    prof = Path(args.profile) if args.profile else None
    if sections & {"latency", "throughput", "stream", "prompt-scaling"}:
        async with deploy(args.workers, args) as d:
            if "latency" in sections:
                for stream in (False, True):
                    row = await latency_phase(d.target, prompts, args.prompt_tokens, args.latency_requests, stream, args.cap_s)
                    report.setdefault("latency", []).append(row)
                    show("latency" + (" stream" if stream else ""), row)
            if "throughput" in sections:
                with profiling(d.gateway.pid, prof / "throughput.txt" if prof else None, args.profile_rate, args.profile_gil):
                    row = await throughput_phase(
                        d.target, prompts, d.meter, args.prompt_tokens, args.concurrency, args.requests, args.cap_s
                    )
                report["throughput"] = row
                show("throughput", row)
            if "stream" in sections:
                with profiling(d.gateway.pid, prof / "stream.txt" if prof else None, args.profile_rate, args.profile_gil):
                    row = await stream_phase(d.target, prompts, d.meter, args.streams, args.stream_tokens, args.cap_s)
                report["stream"] = row
                show("stream", row)
            if "prompt-scaling" in sections:
                for tokens in args.prompt_lengths:
                    n = max(10, args.latency_requests * 2048 // max(tokens, 2048))
                    lat = await latency_phase(d.target, prompts, tokens, n, False, args.cap_s)
                    thr = await throughput_phase(
                        d.target, prompts, d.meter, tokens, args.concurrency, max(40, args.requests * 2048 // max(tokens, 2048)), args.cap_s
                    )
                    row = {**lat, **{k: v for k, v in thr.items() if k not in lat}}
                    report.setdefault("prompt_scaling", []).append(row)
                    show(f"prompt {tokens}", row)
    if "worker-scaling" in sections:
        for workers in args.worker_counts:
            async with deploy(workers, args) as d:
                lat = await latency_phase(d.target, prompts, args.prompt_tokens, args.latency_requests // 2, False, args.cap_s)
                with profiling(d.gateway.pid, prof / f"workers-{workers}.txt" if prof else None, args.profile_rate, args.profile_gil):
                    thr = await throughput_phase(d.target, prompts, d.meter, args.prompt_tokens, args.concurrency, args.requests, args.cap_s)
                row = {"workers": workers, **lat, **{k: v for k, v in thr.items() if k not in lat}}
                report.setdefault("worker_scaling", []).append(row)
                show(f"workers {workers}", row)
    if "relay" in sections:
        report["relay"] = await relay_section(prompts, args)
        show("relay, CPU per token by part (3 rounds each)", report["relay"])
    if "start" in sections:
        report["start"] = await start_section(args)
        show("start, the gsp burst's requests in process", report["start"])
    if "compare" in sections:
        report["compare"] = await compare(args, prompts, prof)
    report["load_after"] = list(os.getloadavg())
    if prof:
        for raw in sorted(prof.glob("*.txt")):
            name = raw.stem
            if raw.stat().st_mtime >= started:
                summary = summarize_profile(raw)
                report.setdefault("profile", {})[name] = summary
                print(f"\nprofile {name}: {summary['samples']} samples")
                for stage, share in summary["stage_percent"].items():
                    print(f"  {share:5.1f}%  {stage}")
                print("  hottest functions (self):")
                for share, frame in summary["top_self_percent"][:15]:
                    print(f"  {share:5.1f}%  {frame}")
    return report


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The scenario's flags (``token-gateway bench NAME --help``)."""
    parser.add_argument("--sections", nargs="+", choices=ALL_SECTIONS, default=SECTIONS, help="what to measure")
    parser.add_argument("--policy", default="cache_aware", help="gateway routing policy")
    parser.add_argument("--workers", type=int, default=1, help="simulated workers (all but worker-scaling)")
    parser.add_argument("--prompt-tokens", type=int, default=2048, help="rendered chat prompt length")
    parser.add_argument("--max-tokens", type=int, default=16, help="output tokens per request (ignore_eos)")
    parser.add_argument("--latency-requests", type=int, default=200, help="latency: request pairs")
    parser.add_argument("--concurrency", type=int, default=32, help="throughput: requests in flight")
    parser.add_argument("--requests", type=int, default=1500, help="throughput: requests at most")
    parser.add_argument("--streams", type=int, default=32, help="stream: concurrent streams")
    parser.add_argument("--stream-tokens", type=int, default=1000, help="stream: tokens per stream")
    parser.add_argument("--prompt-lengths", type=int, nargs="+", default=[512, 2048, 8192, 32768])
    parser.add_argument("--worker-counts", type=int, nargs="+", default=[1, 8, 64])
    parser.add_argument("--context-length", type=int, default=40960, help="simulated model context")
    parser.add_argument("--cap-s", type=float, default=30.0, help="time cap per phase, seconds")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--profile", default="", help="directory for py-spy profiles of the gateway")
    parser.add_argument("--profile-rate", type=int, default=200, help="py-spy samples per second")
    parser.add_argument("--profile-tool", choices=PROFILE_TOOLS, default="py-spy",
                        help="sampler for --profile: py-spy, py-spy-native (C frames too), perf (every thread, kernel included)")
    parser.add_argument(
        "--profile-gil", action=argparse.BooleanOptionalAction, default=True,
        help="sample only the thread holding the GIL (Python CPU; tokenizer threads release it)",
    )
    parser.add_argument("--json", default="", help="write every figure to this JSON file")
    side = parser.add_argument_group("compare: gateways side by side on the same fleets and loads")
    side.add_argument("--gateways", nargs="+", choices=GATEWAYS, default=["ours", "smg"],
                      help="who runs each load, in this order in odd rounds and reversed in even ones (smg: when "
                      "--peers-python exists; before: --baseline-src)")
    side.add_argument("--loads", nargs="+", choices=LOADS, default=LOADS, help="compare: loads to run")
    side.add_argument("--repeat", type=int, default=1,
                      help="compare: repetitions of the whole round (report the spread; 2: both orders once)")
    side.add_argument("--peers-python", default=launch.PEERS_PYTHON, help="python of the peers' virtualenv")
    side.add_argument("--baseline-src", default="", help="src/ of another checkout, run as gateway 'before'")
    side.add_argument("--ours-args", default="", help="extra 'token-gateway serve' flags for gateway 'ours' only")
    side.add_argument("--idle-s", type=float, default=5.0, help="idle CPU: seconds measured with no traffic")
    side.add_argument("--short-workers", type=int, default=8, help="short and multi-turn loads: workers")
    side.add_argument("--short-prompt-tokens", type=int, default=32, help="short load: rendered prompt tokens")
    side.add_argument("--short-max-tokens", type=int, default=8, help="short load: output tokens")
    side.add_argument("--short-concurrency", type=int, default=128, help="short load: requests in flight")
    side.add_argument("--short-requests", type=int, default=3000, help="short load: requests")
    side.add_argument(
        "--short-warm", type=int, default=300,
        help="short load: warm-up requests before it is measured, then a wait for a quiet gateway "
        "(ours builds its fast encoder at a model's 256th prompt)",
    )  # fmt: skip
    side.add_argument("--chat-conversations", type=int, default=32)
    side.add_argument("--chat-turns", type=int, default=6)
    side.add_argument("--chat-system-tokens", type=int, default=512)
    side.add_argument("--chat-user-tokens", type=int, default=128)
    side.add_argument("--chat-reply-tokens", type=int, default=64)
    side.add_argument("--chat-concurrency", type=int, default=16)
    side.add_argument("--gsp-workers", type=int, default=16)
    side.add_argument("--gsp-groups", type=int, default=8)
    side.add_argument("--gsp-prompts-per-group", type=int, default=16)
    side.add_argument("--gsp-system-tokens", type=int, default=2048)
    side.add_argument("--gsp-question-tokens", type=int, default=128)
    side.add_argument("--gsp-output-tokens", type=int, default=128)
    side.add_argument("--gsp-concurrency", type=int, default=128, help="gsp: requests in flight (a burst: all at once)")
    side.add_argument(
        "--worker-step-s", type=float, default=0.0,
        help="compare: each simulated worker step takes this long in real time (e.g. 0.02: 50 tokens/s per stream, "
        "a GPU's pace; the gateway keeps up instead of being the bottleneck); 0: zero-cost workers",
    )
    side.add_argument("--start-bursts", type=int, default=10, help="start: gsp bursts measured in process")


def main(args: argparse.Namespace) -> int:
    """Run the scenario with parsed flags; the exit status."""
    global PROFILE_TOOL
    PROFILE_TOOL = args.profile_tool
    args.peers_installed = os.path.exists(args.peers_python)
    args.baseline_src = os.path.abspath(args.baseline_src) if args.baseline_src else ""
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    result = Result()
    report = asyncio.run(run(args))
    if "compare" in report:
        result.tables.append(compare_table(report["compare"]["rows"], report["compare"]["gateways"]))
    result.notes.append(f"grpcio {grpc.__version__}; load before {report['load_before'][0]:.1f}, after {report['load_after'][0]:.1f}")
    result.data = report
    return write(result, json_path=args.json)
