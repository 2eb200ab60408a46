"""Zero-cost gRPC workers for peer comparisons: the SGLang service with no simulator in it.

Why: a side-by-side of two gateways is only fair on a fleet both serve without stalls, and
it is a second witness beside the simulator, so it shares none of the simulator's code.
Each worker answers ``Generate`` at once (or at ``step_s`` per token, a GPU's pace; with
``prefill_token_s``, after its uncached prompt tokens' prefill, one request's at a time, so a
router that loses the cache, or piles misses on one worker, pays in time to first token): the
streaming shape of SGLang's ``--grpc-mode`` servicer (one chunk per token with running
counts, then a ``GenerateComplete`` that repeats the last chunk's tokens), one complete when
not streaming, finish ``length`` after ``max_new_tokens``. It keeps a set of chained
page hashes as its prefix cache (LRU, bounded in tokens), so ``cached_tokens`` is true for
prefixes it has seen and a router's hit rate is visible. With ``record`` set, each worker
appends one JSON line per ``Generate`` (its port, the time, a key of the prompt's first
``KEY_TOKENS`` tokens, prompt and cached tokens) to that file: which worker got which
shared prefix, told by the fleet itself, so two gateways are compared by one witness.

It reports a model folder (the tokenizer files plus a ``config.json``), as a real server
does: a peer gateway that loads ``config.json`` from the reported path must find it.

Run as ``python -m gateway_lab.bench.zero_fleet --ports P1 P2 ...``: one process, one
grpc.aio server per port, each with its own cache (``--http``: SGLang's HTTP API instead,
``zero_http``; ``--http --http-api vllm``: vLLM's OpenAI server, ``zero_vllm``).
:class:`ZeroFleet` starts such processes and stops them.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import hashlib
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import IO, Any

import grpc
from google.protobuf import struct_pb2

from gateway.proto import common_pb2
from gateway.proto import sglang_scheduler_pb2 as pb
from gateway.proto import sglang_scheduler_pb2_grpc as pb_grpc
from gateway_lab.bench.ports import free_ports

PAGE_SIZE = 16
KEY_TOKENS = 256  # a recorded prompt's group key covers this many leading tokens (whole pages)
DEFAULT_MAX_NEW_TOKENS = 128
TOKENIZER_CHUNK_BYTES = 1 << 20
VERSION = "zero-0"
REPLY_TEXT = " The answer comes from a zero-cost worker that says the same words to everyone who asks it."
# With ``think``: a reasoning model's answer, the reply after a think block (a reasoning
# parser then splits every streamed token until the block ends).
THINK_TEXT = "<think>\nThe user asked a short question; a short answer in plain words will do.\n</think>\n\n"


class PrefixCache:
    """Chained page hashes of the prompts seen, least recently used first out.

    Only whole pages count, as in SGLang's paged radix cache; a page is a hit only when
    every page before it is one too (the chain makes each hash cover its whole prefix)."""

    def __init__(self, capacity_tokens: int, page_size: int = PAGE_SIZE) -> None:
        self.page_size = page_size
        self.capacity_pages = max(1, capacity_tokens // page_size)
        self._pages: collections.OrderedDict[bytes, None] = collections.OrderedDict()

    def _chain(self, ids: Sequence[int]) -> list[bytes]:
        out: list[bytes] = []
        digest = b""
        size = self.page_size
        for start in range(0, len(ids) - size + 1, size):
            page = b"".join(i.to_bytes(4, "little") for i in ids[start : start + size])
            digest = hashlib.blake2b(digest + page, digest_size=16).digest()
            out.append(digest)
        return out

    def admit(self, ids: Sequence[int]) -> int:
        """Cached tokens of ``ids`` (its longest cached page prefix), then cache all its pages."""
        return self.admit_keyed(ids)[0]

    def admit_keyed(self, ids: Sequence[int]) -> tuple[int, str]:
        """``admit``, and the prompt's key: the chained hash of its first ``KEY_TOKENS``
        tokens in whole pages (fewer when the prompt is shorter; "" under one page)."""
        chain = self._chain(ids)
        key = chain[min(len(chain), KEY_TOKENS // self.page_size) - 1].hex()[:16] if chain else ""
        hits = 0
        for digest in chain:
            if digest not in self._pages:
                break
            hits += 1
        for digest in chain:
            self._pages[digest] = None
            self._pages.move_to_end(digest)
        while len(self._pages) > self.capacity_pages:
            self._pages.popitem(last=False)
        return hits * self.page_size, key

    def clear(self) -> None:
        self._pages.clear()


def model_folder(tokenizer_dir: Path, root: Path, context_length: int) -> Path:
    """A model folder: the tokenizer's files and a minimal ``config.json``."""
    folder = root / "model"
    folder.mkdir(parents=True, exist_ok=True)
    for f in tokenizer_dir.iterdir():
        if f.is_file():
            shutil.copy(f, folder / f.name)
    if not (folder / "config.json").exists():
        config = {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "max_position_embeddings": context_length}
        (folder / "config.json").write_text(json.dumps(config))
    return folder


def reply_ids(tokenizer_dir: Path, think: bool = False) -> list[int]:
    """Ordinary token ids the workers cycle through as output (the same reply for everyone),
    a think block first with ``think``."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json"))
    return list(tok.encode((THINK_TEXT if think else "") + REPLY_TEXT, add_special_tokens=False).ids)


HTTP_APIS = ("sglang", "vllm")


class ZeroWorker(pb_grpc.SglangSchedulerServicer):
    """One worker: answers from its arguments, keeps no request state but its prefix cache."""

    def __init__(
        self, folder: Path, output: Sequence[int], step_s: float, capacity_tokens: int, context_length: int,
        port: int = 0, record: IO[str] | None = None, prefill_token_s: float = 0.0,
    ) -> None:  # fmt: skip
        self.folder = folder
        self.prefill_token_s = prefill_token_s
        self._prefill = asyncio.Lock()
        self.port = port
        self.record = record
        self.output = list(output)
        self.step_s = step_s
        self.capacity_tokens = capacity_tokens
        self.context_length = context_length
        self.cache = PrefixCache(capacity_tokens)
        self.running = 0
        self.started = time.time()

    version = VERSION

    def tokens(self, n: int) -> list[int]:
        """The first ``n`` output tokens (the reply, cycled)."""
        out = self.output
        return [out[i % len(out)] for i in range(n)]

    async def prefill(self, uncached: int) -> None:
        """Spend the prefill of ``uncached`` prompt tokens: one prompt at a time per worker
        (prefill is compute-bound on a GPU), so misses queue behind each other."""
        if self.prefill_token_s <= 0 or uncached <= 0:
            return
        async with self._prefill:
            await asyncio.sleep(self.prefill_token_s * uncached)

    def admit(self, prompt: Sequence[int]) -> int:
        """The prompt's cached tokens (then cached whole), recorded when recording."""
        cached, key = self.cache.admit_keyed(prompt)
        if self.record is not None:
            line = {"port": self.port, "t": round(time.time(), 4), "key": key, "prompt": len(prompt), "cached": cached}
            self.record.write(json.dumps(line) + "\n")
        return cached

    async def Generate(self, request: pb.GenerateRequest, context: Any) -> AsyncIterator[pb.GenerateResponse]:
        prompt = request.tokenized.input_ids
        if not prompt:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "input_ids must not be empty")
        sp = request.sampling_params
        max_new = sp.max_new_tokens if sp.HasField("max_new_tokens") else DEFAULT_MAX_NEW_TOKENS
        if len(prompt) + max_new > self.context_length:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "the prompt plus max_new_tokens exceeds the context")
        n = max(1, sp.n)
        cached = self.admit(prompt)
        rid = request.request_id
        prompt_len = len(prompt)
        tokens = self.tokens(max_new)
        self.running += 1
        try:
            await self.prefill(prompt_len - cached)
            if not request.stream:
                for index in range(n):
                    complete = pb.GenerateComplete(
                        output_ids=tokens, finish_reason="length", prompt_tokens=prompt_len,
                        completion_tokens=max_new, cached_tokens=cached, index=index,
                    )  # fmt: skip
                    if self.step_s:
                        await asyncio.sleep(self.step_s * max_new)
                    yield pb.GenerateResponse(request_id=rid, complete=complete)
                return
            for done in range(1, max_new + 1):
                if self.step_s:
                    await asyncio.sleep(self.step_s)
                for index in range(n):
                    chunk = pb.GenerateStreamChunk(
                        token_ids=tokens[done - 1 : done], prompt_tokens=prompt_len,
                        completion_tokens=done, cached_tokens=cached, index=index,
                    )  # fmt: skip
                    yield pb.GenerateResponse(request_id=rid, chunk=chunk)
            for index in range(n):
                complete = pb.GenerateComplete(
                    output_ids=tokens[-1:], finish_reason="length", prompt_tokens=prompt_len,
                    completion_tokens=max_new, cached_tokens=cached, index=index,
                )  # fmt: skip
                yield pb.GenerateResponse(request_id=rid, complete=complete)
        finally:
            self.running -= 1

    async def HealthCheck(self, request: pb.HealthCheckRequest, context: Any) -> pb.HealthCheckResponse:
        return pb.HealthCheckResponse(healthy=True, message="ok")

    async def Abort(self, request: pb.AbortRequest, context: Any) -> pb.AbortResponse:
        return pb.AbortResponse(success=False, message=f"request {request.request_id} not found")

    async def GetModelInfo(self, request: pb.GetModelInfoRequest, context: Any) -> pb.GetModelInfoResponse:
        return pb.GetModelInfoResponse(
            model_path=str(self.folder), tokenizer_path=str(self.folder), is_generation=True,
            served_model_name="zero", max_context_length=self.capacity_tokens, model_type="qwen3",
            max_req_input_len=self.context_length - 1, architectures=["Qwen3ForCausalLM"],
            weight_version="default",
        )  # fmt: skip

    async def GetServerInfo(self, request: pb.GetServerInfoRequest, context: Any) -> pb.GetServerInfoResponse:
        server_args = struct_pb2.Struct()
        server_args.update({
            "model_path": str(self.folder), "tokenizer_path": str(self.folder), "served_model_name": "zero",
            "page_size": PAGE_SIZE, "context_length": self.context_length, "skip_tokenizer_init": True,
            "grpc_mode": True,
        })  # fmt: skip
        scheduler_info = struct_pb2.Struct()
        scheduler_info.update({"max_total_num_tokens": self.capacity_tokens, "page_size": PAGE_SIZE})
        return pb.GetServerInfoResponse(
            server_args=server_args, scheduler_info=scheduler_info, active_requests=self.running,
            uptime_seconds=time.time() - self.started, sglang_version=VERSION, server_type="grpc",
            max_total_num_tokens=self.capacity_tokens,
        )  # fmt: skip

    async def GetLoads(self, request: pb.GetLoadsRequest, context: Any) -> pb.GetLoadsResponse:
        load = pb.SchedulerLoad(
            num_running_reqs=self.running, num_total_reqs=self.running, max_total_num_tokens=self.capacity_tokens
        )
        return pb.GetLoadsResponse(
            timestamp=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), version=VERSION, dp_rank_count=1,
            loads=[load], aggregate=pb.AggregateMetrics(total_running_reqs=self.running, total_reqs=self.running),
        )  # fmt: skip

    async def FlushCache(self, request: common_pb2.FlushCacheRequest, context: Any) -> common_pb2.FlushCacheResponse:
        self.cache.clear()
        return common_pb2.FlushCacheResponse(success=True, message="flushed")

    async def GetTokenizer(self, request: common_pb2.GetTokenizerRequest, context: Any) -> AsyncIterator[common_pb2.GetTokenizerChunk]:
        buf = io.BytesIO()
        with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED, compresslevel=1) as zf:
            for f in sorted(self.folder.iterdir()):
                if f.is_file():
                    zf.write(f, f.name)
        data = buf.getvalue()
        digest = hashlib.sha256(data).hexdigest()
        for start in range(0, len(data), TOKENIZER_CHUNK_BYTES):
            last = start + TOKENIZER_CHUNK_BYTES >= len(data)
            yield common_pb2.GetTokenizerChunk(data=data[start : start + TOKENIZER_CHUNK_BYTES], sha256=digest if last else "")


async def serve(
    ports: Sequence[int], folder: Path, step_s: float, capacity_tokens: int, context_length: int,
    record: IO[str] | None = None, http: bool = False, think: bool = False, prefill_token_s: float = 0.0,
    http_api: str = "sglang",
) -> None:  # fmt: skip
    """One server per port until SIGTERM/SIGINT: grpc.aio, or over HTTP (``http``) SGLang's
    API or vLLM's (``http_api``)."""
    output = reply_ids(folder, think)
    servers = []
    runners = []
    tokenizer = None
    for port in ports:
        worker = ZeroWorker(folder, output, step_s, capacity_tokens, context_length, port, record, prefill_token_s)
        if http:
            from tokenizers import Tokenizer

            from gateway_lab.bench import zero_http, zero_vllm

            tokenizer = tokenizer or Tokenizer.from_file(str(folder / "tokenizer.json"))
            face = zero_vllm if http_api == "vllm" else zero_http
            runners.append(await face.start(worker, port, tokenizer))
            continue
        server = grpc.aio.server(options=[("grpc.so_reuseport", 0)])
        pb_grpc.add_SglangSchedulerServicer_to_server(worker, server)
        server.add_insecure_port(f"127.0.0.1:{port}")
        await server.start()
        servers.append(server)
    print("ready", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    flusher = asyncio.create_task(_flush_every(record, 0.2)) if record is not None else None
    await stop.wait()
    if flusher is not None:
        flusher.cancel()
    await asyncio.gather(*(s.stop(0.5) for s in servers), *(r.cleanup() for r in runners))
    if record is not None:
        record.flush()


async def _flush_every(record: IO[str], interval_s: float) -> None:
    """Flush the record now and then: a reader sees each load's lines soon after it ends."""
    while True:
        await asyncio.sleep(interval_s)
        record.flush()


def read_records(folder: Path, since: float = 0.0, until: float = float("inf")) -> list[dict[str, Any]]:
    """Every worker's recorded ``Generate`` lines under ``folder`` with ``since <= t <= until``."""
    out: list[dict[str, Any]] = []
    for path in sorted(folder.glob("zero-*.jsonl")):
        for line in path.read_text().splitlines():
            with contextlib.suppress(ValueError):
                rec = json.loads(line)
                if since <= rec["t"] <= until:
                    out.append(rec)
    out.sort(key=lambda r: r["t"])
    return out


def placement(records: Sequence[dict[str, Any]], min_group: int = 2) -> dict[str, Any]:
    """Where each prompt group (a key seen at least ``min_group`` times) went, from records.

    ``holders``: distinct workers per group (1 is perfect stickiness); ``spread``: requests
    per worker of each group, largest first; ``hit_rate`` over every record; ``ideal``: the
    hit rate were every group on one worker with the first request's cached tokens as the
    only miss (whole pages of the shared part, read from the records' best hit per group).
    """
    groups: dict[str, list[dict[str, Any]]] = {}
    for rec in records:
        groups.setdefault(rec["key"], []).append(rec)
    prompt = sum(r["prompt"] for r in records)
    cached = sum(r["cached"] for r in records)
    ideal = 0
    spread: dict[str, list[int]] = {}
    for key, recs in groups.items():
        if len(recs) < min_group or not key:
            continue
        per = collections.Counter(r["port"] for r in recs)
        spread[key] = sorted(per.values(), reverse=True)
        ideal += max(r["cached"] for r in recs) * (len(recs) - 1)
    holders = [len(v) for v in spread.values()]
    return {
        "requests": len(records), "groups": len(spread),
        "hit_rate": round(cached / prompt, 4) if prompt else None,
        "ideal": round(ideal / prompt, 4) if prompt else None,
        "holders_mean": round(sum(holders) / len(holders), 3) if holders else 0.0,
        "holders_max": max(holders, default=0),
        "spread": spread,
    }  # fmt: skip


class ZeroFleet:
    """``workers`` zero-cost workers in ``processes`` child processes (ports split evenly)."""

    def __init__(
        self, workers: int, tokenizer_dir: Path, *, step_s: float = 0.0, processes: int = 1,
        capacity_tokens: int = 65536, context_length: int = 40960, record_dir: Path | None = None,
        http: bool = False, think: bool = False, prefill_token_s: float = 0.0, http_api: str = "sglang",
    ) -> None:  # fmt: skip
        if http_api not in HTTP_APIS:
            raise ValueError(f"http_api must be one of {', '.join(HTTP_APIS)}, not {http_api!r}")
        self.ports = free_ports(workers)
        self.prefill_token_s = prefill_token_s
        self.http = http
        self.http_api = http_api
        self.think = think
        self.record_dir = record_dir
        self.tokenizer_dir = tokenizer_dir
        self.step_s = step_s
        self.processes = max(1, min(processes, workers))
        self.capacity_tokens = capacity_tokens
        self.context_length = context_length
        self.procs: list[subprocess.Popen[bytes]] = []
        self._root: tempfile.TemporaryDirectory[str] | None = None

    @property
    def urls(self) -> list[str]:
        scheme = "http" if self.http else "grpc"
        return [f"{scheme}://127.0.0.1:{p}" for p in self.ports]

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.procs]

    def start(self, ready_timeout_s: float = 60.0) -> ZeroFleet:
        self._root = tempfile.TemporaryDirectory(prefix="zero-fleet-")
        folder = model_folder(self.tokenizer_dir, Path(self._root.name), self.context_length)
        share = [self.ports[i :: self.processes] for i in range(self.processes)]
        try:
            for ports in share:
                argv = [
                    sys.executable, "-m", "gateway_lab.bench.zero_fleet", "--folder", str(folder),
                    "--step-s", str(self.step_s), "--prefill-token-s", str(self.prefill_token_s),
                    "--capacity-tokens", str(self.capacity_tokens),
                    "--context-length", str(self.context_length), "--ports", *map(str, ports),
                ]  # fmt: skip
                if self.http:
                    argv += ["--http", "--http-api", self.http_api]
                if self.think:
                    argv.append("--think")
                if self.record_dir is not None:
                    argv += ["--record", str(self.record_dir / f"zero-{ports[0]}.jsonl")]
                self.procs.append(subprocess.Popen(argv, stdout=subprocess.PIPE, start_new_session=True))
            deadline = time.monotonic() + ready_timeout_s
            for proc in self.procs:
                assert proc.stdout is not None
                line = proc.stdout.readline()
                if line.strip() != b"ready" or time.monotonic() > deadline:
                    raise RuntimeError(f"zero-cost worker process {proc.pid} did not start (exit {proc.poll()})")
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(5)
            if proc.stdout:
                proc.stdout.close()
        self.procs = []
        if self._root is not None:
            self._root.cleanup()
            self._root = None

    async def __aenter__(self) -> ZeroFleet:
        return await asyncio.to_thread(self.start)

    async def __aexit__(self, *exc: Any) -> None:
        await asyncio.to_thread(self.stop)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="zero-cost SGLang-service workers, one per port")
    parser.add_argument("--ports", type=int, nargs="+", required=True)
    parser.add_argument("--folder", required=True, help="model folder (tokenizer files and config.json)")
    parser.add_argument("--step-s", type=float, default=0.0, help="seconds per generated token (0: at once)")
    parser.add_argument("--prefill-token-s", type=float, default=0.0,
                        help="seconds per uncached prompt token before the first token (one prompt at a time)")
    parser.add_argument("--capacity-tokens", type=int, default=65536, help="prefix cache size per worker, LRU")
    parser.add_argument("--context-length", type=int, default=40960)
    parser.add_argument("--record", default="", help="append one JSON line per Generate to this file")
    parser.add_argument("--http", action="store_true", help="serve an HTTP API instead of SGLang's gRPC service")
    parser.add_argument("--http-api", choices=HTTP_APIS, default="sglang",
                        help="with --http: SGLang's native API or vLLM's OpenAI server")
    parser.add_argument("--think", action="store_true", help="answer as a reasoning model: a think block, then the reply")
    args = parser.parse_args(argv)
    record = open(args.record, "a", encoding="utf-8") if args.record else None
    try:
        asyncio.run(serve(
            args.ports, Path(args.folder), args.step_s, args.capacity_tokens, args.context_length, record, args.http, args.think,
            args.prefill_token_s, args.http_api,
        ))  # fmt: skip
    finally:
        if record is not None:
            record.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
