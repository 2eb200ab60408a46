"""An independent gRPC client of SGLang's servicer, built on the official stubs.

Run as a subprocess (``python -m tests.interop_sglang.grpc_client COMMAND PORT``,
JSON out): the official generated modules register the same .proto files as
token-gateway's, so they never share a process with the gateway's code.

Commands:
  health          one HealthCheck
  unary-n         a non-streaming Generate with n=2: the index of each completion
  abort           a streamed Generate, Abort after a few chunks, then whether the
                  stream ended (and how) within a wait
  latency N C     N short non-streaming Generates, C in flight: p50/p99 latency
  info            what GetModelInfo and GetServerInfo report
  stream-end      a streamed Generate: each chunk's ids and the final complete's
"""

from __future__ import annotations

import json
import statistics
import sys
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import grpc
from google.protobuf.json_format import MessageToDict
from smg_grpc_proto.generated import sglang_scheduler_pb2 as pb
from smg_grpc_proto.generated import sglang_scheduler_pb2_grpc as pb_grpc

PROMPT = [9707, 1052, 11, 1246, 525, 498, 30]  # "Hello there, how are you?"


def _request(max_new: int, *, stream: bool, n: int = 1, ignore_eos: bool = False) -> pb.GenerateRequest:
    return pb.GenerateRequest(
        request_id=uuid.uuid4().hex,
        tokenized=pb.TokenizedInput(original_text="", input_ids=PROMPT),
        sampling_params=pb.SamplingParams(temperature=1.0, top_p=1.0, max_new_tokens=max_new, n=n,
                                          ignore_eos=ignore_eos),
        stream=stream,
    )


def health(stub: Any) -> dict[str, Any]:
    reply = stub.HealthCheck(pb.HealthCheckRequest(), timeout=30)
    return {"healthy": reply.healthy, "message": reply.message}


def unary_n(stub: Any) -> dict[str, Any]:
    indexes = []
    for msg in stub.Generate(_request(4, stream=False, n=2), timeout=30):
        if msg.HasField("complete"):
            indexes.append(msg.complete.index)
    return {"complete_indexes": indexes}


def abort(stub: Any, wait_s: float = 3.0) -> dict[str, Any]:
    req = _request(100000, stream=True, ignore_eos=True)
    call = stub.Generate(req, timeout=60)
    seen: list[str] = []
    ended: dict[str, Any] = {}
    first = threading.Event()

    def read() -> None:
        try:
            for msg in call:
                seen.append(msg.WhichOneof("response"))
                if len(seen) >= 3:
                    first.set()
            ended["how"] = "end of stream"
        except grpc.RpcError as exc:
            ended["how"] = f"status {exc.code().name}"
        first.set()

    t = threading.Thread(target=read, daemon=True)
    t.start()
    first.wait(30)
    before = len(seen)
    reply = stub.Abort(pb.AbortRequest(request_id=req.request_id, reason="test"), timeout=10)
    t.join(wait_s)
    result = {"abort_success": reply.success, "messages_before_abort": before,
              "messages_after_abort": len(seen) - before, "ended": ended.get("how"),
              "request_id": req.request_id}
    call.cancel()
    return result


def latency(stub: Any, total: int, concurrency: int) -> dict[str, Any]:
    def one(_: int) -> float:
        t0 = time.perf_counter()
        for _msg in stub.Generate(_request(8, stream=False), timeout=60):
            pass
        return time.perf_counter() - t0

    t0 = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        times = sorted(pool.map(one, range(total)))
    wall = time.perf_counter() - t0
    q = statistics.quantiles(times, n=100)
    return {"requests": total, "concurrency": concurrency, "wall_s": round(wall, 3),
            "p50_ms": round(q[49] * 1000, 1), "p99_ms": round(q[98] * 1000, 1),
            "max_ms": round(times[-1] * 1000, 1), "over_1s": sum(t > 1.0 for t in times)}


def stream_end(stub: Any) -> dict[str, Any]:
    chunks: list[list[int]] = []
    complete: dict[str, Any] = {}
    for msg in stub.Generate(_request(5, stream=True), timeout=30):
        if msg.HasField("chunk"):
            chunks.append(list(msg.chunk.token_ids))
        elif msg.HasField("complete"):
            complete = {"output_ids": list(msg.complete.output_ids), "finish_reason": msg.complete.finish_reason,
                        "completion_tokens": msg.complete.completion_tokens}
    return {"chunks": chunks, "complete": complete}


def info(stub: Any) -> dict[str, Any]:
    m = stub.GetModelInfo(pb.GetModelInfoRequest(), timeout=30)
    s = stub.GetServerInfo(pb.GetServerInfoRequest(), timeout=30)
    server_args = MessageToDict(s.server_args)
    return {"max_context_length": m.max_context_length, "max_req_input_len": m.max_req_input_len,
            "vocab_size": m.vocab_size, "eos_token_ids": list(m.eos_token_ids),
            "default_sampling_params": json.loads(m.default_sampling_params_json or "{}"),
            "page_size": server_args.get("page_size"), "max_total_num_tokens": s.max_total_num_tokens}


def main(argv: list[str]) -> int:
    command, port = argv[0], int(argv[1])
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    stub = pb_grpc.SglangSchedulerStub(channel)
    if command == "health":
        out = health(stub)
    elif command == "unary-n":
        out = unary_n(stub)
    elif command == "abort":
        out = abort(stub)
    elif command == "stream-end":
        out = stream_end(stub)
    elif command == "info":
        out = info(stub)
    elif command == "latency":
        out = latency(stub, int(argv[2]), int(argv[3]))
    else:
        raise SystemExit(f"unknown command {command!r}")
    print(json.dumps(out))
    channel.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
