"""The official (smg-grpc-proto) side of the interop tests, run as a subprocess.

The official generated modules register the same .proto file names and packages
as token-gateway's in protobuf's default descriptor pool, so the two cannot live
in one process. The tests run this script with `sys.executable` and exchange
serialized messages as base64 in JSON.

Commands (JSON on stdin, JSON on stdout):
  describe     the reference FileDescriptorProtos of sglang_scheduler.proto, common.proto,
               vllm_engine.proto and trtllm_service.proto
  roundtrip    parse given bytes with the official classes, re-serialize them, and
               build the same plans with the official classes
  serve LOG    run an official SglangSchedulerServicer on 127.0.0.1:0, print
               {"port": N}, log every request to LOG, stop when stdin closes
  client       call Generate (streaming and not) and some unary RPCs on a target
               with the official stub
  serve-vllm LOG  run an official VllmEngineServicer answering as vLLM's servicer does
               (VLLM_* below), logging every request to LOG
  serve-trtllm LOG  the same for TensorRT-LLM's TrtllmService (scenario.TRT_*)
"""

from __future__ import annotations

import base64
import hashlib
import json
import sys
import threading
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

# Run as a script, sys.path[0] is this folder: swap it for its parent so the
# folder imports as the package `interop`, never its modules as top-level names.
# Appended, not prepended: tests/ holds packages named like stdlib modules
# (tests/inspect) that must not shadow them.
sys.path.pop(0)
sys.path.append(str(Path(__file__).resolve().parent.parent))

import grpc
from google.protobuf import (
    descriptor_pool,
    json_format,
    message_factory,
)
from google.protobuf.message import Message
from smg_grpc_proto.generated import (
    common_pb2,
    sglang_scheduler_pb2,
    sglang_scheduler_pb2_grpc,
    trtllm_service_pb2,
    trtllm_service_pb2_grpc,
    vllm_engine_pb2,
    vllm_engine_pb2_grpc,
)

from interop import scenario
from interop.populate import Plan, canonical, populate, unknown_fields

REFERENCE_FILES = (
    sglang_scheduler_pb2.DESCRIPTOR, common_pb2.DESCRIPTOR, vllm_engine_pb2.DESCRIPTOR, trtllm_service_pb2.DESCRIPTOR,
)
_SERVICE = sglang_scheduler_pb2.DESCRIPTOR.services_by_name["SglangScheduler"]


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _message_class(full_name: str) -> type[Message]:
    descriptor = descriptor_pool.Default().FindMessageTypeByName(full_name)
    return message_factory.GetMessageClass(descriptor)


def _build(full_name: str, plan: Plan) -> Message:
    return populate(_message_class(full_name)(), plan)


def describe(_: dict[str, Any]) -> dict[str, Any]:
    from google.protobuf import descriptor_pb2

    files = {}
    for file_descriptor in REFERENCE_FILES:
        proto = descriptor_pb2.FileDescriptorProto()
        file_descriptor.CopyToProto(proto)
        files[file_descriptor.name] = json_format.MessageToDict(
            proto, preserving_proto_field_name=True
        )
    return {"files": files}


def roundtrip(request: dict[str, Any]) -> dict[str, Any]:
    results = {}
    for case in request["cases"]:
        cls = _message_class(case["type"])
        parsed = cls.FromString(base64.b64decode(case["payload"]))
        result = {
            "parsed": canonical(parsed),
            "unknown": unknown_fields(parsed),
            "reserialized": _b64(parsed.SerializeToString(deterministic=True)),
        }
        if case.get("plan") is not None:
            built = _build(case["type"], Plan.from_json(case["plan"]))
            result["built"] = _b64(built.SerializeToString(deterministic=True))
            result["built_canonical"] = canonical(built)
        results[case["id"]] = result
    return {"results": results}


class _Log:
    """Appends one JSON line per received request, for the test to check afterwards."""

    def __init__(self, path: Path) -> None:
        self._path = path
        self._lock = threading.Lock()

    def record(self, method: str, request: Message) -> None:
        line = json.dumps(
            {
                "method": method,
                "payload": _b64(request.SerializeToString(deterministic=True)),
                "canonical": canonical(request),
                "unknown": unknown_fields(request),
            }
        )
        with self._lock, self._path.open("a") as out:
            out.write(line + "\n")


def _unary_reply(method: str) -> Message:
    full_name, plan = scenario.UNARY_REPLY_PLANS[method]
    return _build(full_name, plan)


class OfficialServicer(sglang_scheduler_pb2_grpc.SglangSchedulerServicer):
    """Answers every RPC token-gateway declares with replies built from `scenario`."""

    def __init__(self, log: _Log) -> None:
        self._log = log

    def Generate(self, request: Message, context: grpc.ServicerContext) -> Iterator[Message]:
        self._log.record("Generate", request)
        plans = scenario.STREAM_REPLIES if request.stream else scenario.UNARY_REPLIES
        for plan in plans:
            reply = _build(f"{scenario.SCHEDULER}.GenerateResponse", plan)
            reply.request_id = request.request_id
            yield reply

    def _unary(self, method: str, request: Message) -> Message:
        self._log.record(method, request)
        return _unary_reply(method)

    def Embed(self, request: Message, context: grpc.ServicerContext) -> Message:
        return self._unary("Embed", request)

    def HealthCheck(self, request: Message, context: grpc.ServicerContext) -> Message:
        return self._unary("HealthCheck", request)

    def Abort(self, request: Message, context: grpc.ServicerContext) -> Message:
        return self._unary("Abort", request)

    def GetModelInfo(self, request: Message, context: grpc.ServicerContext) -> Message:
        return self._unary("GetModelInfo", request)

    def GetServerInfo(self, request: Message, context: grpc.ServicerContext) -> Message:
        return self._unary("GetServerInfo", request)

    def GetLoads(self, request: Message, context: grpc.ServicerContext) -> Message:
        return self._unary("GetLoads", request)

    def FlushCache(self, request: Message, context: grpc.ServicerContext) -> Message:
        return self._unary("FlushCache", request)

    def GetTokenizer(self, request: Message, context: grpc.ServicerContext) -> Iterator[Message]:
        self._log.record("GetTokenizer", request)
        data, size = scenario.TOKENIZER_ZIP, scenario.TOKENIZER_PIECE
        starts = range(0, len(data), size)
        for start in starts:
            chunk = common_pb2.GetTokenizerChunk(data=data[start : start + size])
            if start == starts[-1]:
                chunk.sha256 = hashlib.sha256(data).hexdigest()
            yield chunk

    def SubscribeKvEvents(
        self, request: Message, context: grpc.ServicerContext
    ) -> Iterator[Message]:
        self._log.record("SubscribeKvEvents", request)
        for plan in scenario.KV_EVENT_REPLIES:
            yield _build(f"{scenario.COMMON}.KvEventBatch", plan)


def serve(log_path: str) -> None:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    sglang_scheduler_pb2_grpc.add_SglangSchedulerServicer_to_server(
        OfficialServicer(_Log(Path(log_path))), server
    )
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    print(json.dumps({"port": port}), flush=True)
    sys.stdin.read()  # the test closes our stdin to stop us
    server.stop(grace=None)




class OfficialVllmServicer(vllm_engine_pb2_grpc.VllmEngineServicer):
    """vLLM's engine service on the official classes, answering as ``scenario.VLLM_*`` says."""

    def __init__(self, log: _Log) -> None:
        self._log = log

    def Generate(self, request: Message, context: grpc.ServicerContext) -> Iterator[Message]:
        self._log.record("Generate", request)
        v = vllm_engine_pb2
        counts = {"prompt_tokens": scenario.VLLM_PROMPT_TOKENS, "cached_tokens": scenario.VLLM_CACHED}
        for index in range(max(1, request.sampling_params.n)):
            if request.stream:
                for ids in scenario.VLLM_STREAM:
                    yield v.GenerateResponse(chunk=v.GenerateStreamChunk(
                        token_ids=ids, completion_tokens=len(ids), index=index, **counts))
                last = scenario.VLLM_STREAM[-1]
                yield v.GenerateResponse(complete=v.GenerateComplete(
                    output_ids=last, completion_tokens=len(last), finish_reason="stop", matched_token_id=last[-1],
                    index=index, **counts))
            else:
                yield v.GenerateResponse(complete=v.GenerateComplete(
                    output_ids=scenario.VLLM_UNARY, completion_tokens=len(scenario.VLLM_UNARY), finish_reason="length",
                    index=index, **counts))

    def HealthCheck(self, request: Message, context: grpc.ServicerContext) -> Message:
        self._log.record("HealthCheck", request)
        return vllm_engine_pb2.HealthCheckResponse(healthy=True, message="Health")

    def Abort(self, request: Message, context: grpc.ServicerContext) -> Message:
        self._log.record("Abort", request)
        return vllm_engine_pb2.AbortResponse()

    def GetModelInfo(self, request: Message, context: grpc.ServicerContext) -> Message:
        self._log.record("GetModelInfo", request)
        return vllm_engine_pb2.GetModelInfoResponse(
            model_path="/models/m", served_model_name="m", max_context_length=scenario.VLLM_CONTEXT, vocab_size=1000,
            eos_token_ids=[2], is_generation=True, max_req_input_len=scenario.VLLM_CONTEXT,
        )

    def GetServerInfo(self, request: Message, context: grpc.ServicerContext) -> Message:
        self._log.record("GetServerInfo", request)
        return vllm_engine_pb2.GetServerInfoResponse(
            server_type="vllm-grpc", block_size=scenario.VLLM_BLOCK, data_parallel_size=1, max_num_seqs=8, uptime_seconds=3.0,
        )

    def GetLoads(self, request: Message, context: grpc.ServicerContext) -> Message:
        self._log.record("GetLoads", request)
        return vllm_engine_pb2.GetLoadsResponse(dp_rank_count=1, loads=[vllm_engine_pb2.SchedulerLoad(
            num_running_reqs=1, num_waiting_reqs=2, num_total_reqs=3, max_total_num_tokens=scenario.VLLM_KV,
        )])

    def Embed(self, request: Message, context: grpc.ServicerContext) -> Message:
        self._log.record("Embed", request)
        return vllm_engine_pb2.EmbedResponse(embedding=[0.5, -0.5], prompt_tokens=len(request.tokenized.input_ids),
                                             embedding_dim=2)


def serve_vllm(log_path: str) -> None:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    vllm_engine_pb2_grpc.add_VllmEngineServicer_to_server(OfficialVllmServicer(_Log(Path(log_path))), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    print(json.dumps({"port": port}), flush=True)
    sys.stdin.read()  # the test closes our stdin to stop us
    server.stop(grace=None)


class OfficialTrtllmServicer(trtllm_service_pb2_grpc.TrtllmServiceServicer):
    """TensorRT-LLM's service on the official classes, answering as ``scenario.TRT_*`` says:
    chunks with running counts and a complete holding every id, as its servicer sends them."""

    def __init__(self, log: _Log) -> None:
        self._log = log

    def Generate(self, request: Message, context: grpc.ServicerContext) -> Iterator[Message]:
        self._log.record("Generate", request)
        t = trtllm_service_pb2
        counts = {"prompt_tokens": scenario.TRT_PROMPT_TOKENS, "cached_tokens": scenario.TRT_CACHED}
        every = [i for ids in scenario.TRT_STREAM for i in ids]
        for index in range(max(1, request.sampling_config.num_return_sequences)):
            if request.streaming:
                yield t.GenerateResponse(request_id=request.request_id, chunk=t.GenerateStreamChunk(
                    sequence_index=index, **counts))  # nothing yet: an empty chunk
                total = 0
                for ids in scenario.TRT_STREAM:
                    total += len(ids)
                    yield t.GenerateResponse(request_id=request.request_id, chunk=t.GenerateStreamChunk(
                        token_ids=ids, completion_tokens=total, sequence_index=index, **counts))
            yield t.GenerateResponse(request_id=request.request_id, complete=t.GenerateComplete(
                output_token_ids=every, completion_tokens=len(every), finish_reason="stop_word",
                matched_token_id=every[-1], sequence_index=index, **counts))

    def HealthCheck(self, request: Message, context: grpc.ServicerContext) -> Message:
        self._log.record("HealthCheck", request)
        return trtllm_service_pb2.HealthCheckResponse(status="OK")

    def Abort(self, request: Message, context: grpc.ServicerContext) -> Message:
        self._log.record("Abort", request)
        return trtllm_service_pb2.AbortResponse(success=False, message=f"Request {request.request_id} not found")

    def GetModelInfo(self, request: Message, context: grpc.ServicerContext) -> Message:
        self._log.record("GetModelInfo", request)
        return trtllm_service_pb2.GetModelInfoResponse(
            model_id="org/m", max_input_len=scenario.TRT_CONTEXT - 1, max_seq_len=scenario.TRT_CONTEXT,
            max_batch_size=8, vocab_size=scenario.TRT_VOCAB,
        )

    def GetServerInfo(self, request: Message, context: grpc.ServicerContext) -> Message:
        self._log.record("GetServerInfo", request)
        return trtllm_service_pb2.GetServerInfoResponse(version="1.0", backend="pytorch", tensor_parallel_size=1)


def serve_trtllm(log_path: str) -> None:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    trtllm_service_pb2_grpc.add_TrtllmServiceServicer_to_server(OfficialTrtllmServicer(_Log(Path(log_path))), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    print(json.dumps({"port": port}), flush=True)
    sys.stdin.read()  # the test closes our stdin to stop us
    server.stop(grace=None)


def client(request: dict[str, Any]) -> dict[str, Any]:
    """Call `target` with the official stub: Generate streaming and not, then each
    method in `unary` with an empty request. Replies come back as canonical dicts
    with the fields the official classes did not know."""
    out: dict[str, Any] = {"generate": {}, "unary": {}}
    timeout = request.get("timeout", 10)
    with grpc.insecure_channel(request["target"]) as channel:
        grpc.channel_ready_future(channel).result(timeout=timeout)
        stub = sglang_scheduler_pb2_grpc.SglangSchedulerStub(channel)
        for label, stream in (("stream", True), ("unary", False)):
            generate = json_format.ParseDict(
                request["generate"], sglang_scheduler_pb2.GenerateRequest()
            )
            generate.request_id = f"{generate.request_id}-{label}"
            generate.stream = stream
            out["generate"][label] = [
                {"canonical": canonical(reply), "unknown": unknown_fields(reply)}
                for reply in stub.Generate(generate, timeout=timeout)
            ]
        for method in request.get("unary", []):
            rpc = getattr(stub, method)
            input_type = _SERVICE.methods_by_name[method].input_type
            reply = rpc(_message_class(input_type.full_name)(), timeout=timeout)
            out["unary"][method] = {"canonical": canonical(reply), "unknown": unknown_fields(reply)}
    return out


COMMANDS = {"describe": describe, "roundtrip": roundtrip, "client": client}


def main(argv: list[str]) -> int:
    command = argv[1]
    if command == "serve":
        serve(argv[2])
        return 0
    if command == "serve-vllm":
        serve_vllm(argv[2])
        return 0
    if command == "serve-trtllm":
        serve_trtllm(argv[2])
        return 0
    result = COMMANDS[command](json.load(sys.stdin))
    json.dump(result, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
