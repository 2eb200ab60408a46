"""The gateway in front of a data-parallel vLLM (``--data-parallel-size 2``): one target per
engine, loads per engine, each request pinned to the engine whose cache its rank's tree
predicts.

The two engines sit behind vLLM's own load-balancing DP client logic (the stand-in calls
``DPLBAsyncMPClient``'s routing), vLLM's own stat loggers label each engine's series on
``/metrics``, and the gRPC servicer reads each engine's stats and in-flight table as it
does in a real DP server. The recording says, for every request, the rank the gateway
named (``data_parallel_rank``, as vLLM read it) and the engine that served it.
"""

from __future__ import annotations

import time
from typing import Any

import httpx
import openai
import pytest

from tests.interop_sglang.servers import Process, Recording
from tests.interop_vllm.servers import SERVED_MODEL

# The first test of a module starts its servers (two vLLMs and two gateways): minutes on a
# loaded two-core host.
pytestmark = pytest.mark.timeout(900)


def _recording(proc: Process) -> Recording:
    """What the engines behind ``proc`` (a gateway, or vLLM's server itself) receive from now on."""
    server = proc.extra.get("worker", proc)
    rec: Recording = server.extra["recording"]
    rec.mark()
    return rec


def _client(front: Process) -> openai.OpenAI:
    return openai.OpenAI(base_url=front.extra["url"] + "/v1", api_key="interop", max_retries=0, timeout=60)


def _preamble(i: int) -> str:
    """A prompt of several 64-token blocks, different from the start for each ``i``."""
    return f"Preamble number {i} of the data-parallel test. " + " ".join(f"w{i}x{k}" for k in range(220))


def test_each_engine_is_a_target_of_its_own(dp_front: Process) -> None:
    workers = httpx.get(dp_front.extra["url"] + "/workers", timeout=10).json()["workers"]
    assert sorted(w["dp_rank"] for w in workers) == [0, 1]
    assert {w["dp_size"] for w in workers} == {2} and len({w["engine_id"] for w in workers}) == 1
    assert all(w["healthy"] and w["model"] == SERVED_MODEL for w in workers)


def test_loads_come_per_engine(dp_front: Process) -> None:
    """A running request shows on its own engine's row only (vLLM's ``engine``-labelled
    gauges over HTTP, the servicer's per-rank GetLoads over gRPC), read once per engine."""
    rec = _recording(dp_front)
    client = _client(dp_front)
    stream = client.completions.create(
        model=SERVED_MODEL, prompt="hold this engine busy", max_tokens=3000, stream=True,
        extra_body={"ignore_eos": True},
    )  # fmt: skip
    try:
        next(iter(stream))
        (record,) = rec.wait("generate", 1)
        busy = record["engine"]
        rows: dict[int, Any] = {}
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            (engine,) = httpx.get(dp_front.extra["url"] + "/get_loads", timeout=10).json()["workers"]
            rows = {int(x.get("dp_rank", 0)): x for x in engine["loads"]["loads"]}
            if rows.get(busy, {}).get("num_running_reqs") == 1:
                break
            time.sleep(0.1)
        assert sorted(rows) == [0, 1]
        assert rows[busy].get("num_running_reqs") == 1 and not rows[1 - busy].get("num_running_reqs")
    finally:
        stream.close()
        client.close()


def test_requests_are_pinned_to_the_rank_whose_tree_holds_their_prefix(dp_front: Process) -> None:
    rec = _recording(dp_front)
    client = _client(dp_front)
    try:
        cached = []
        for i in range(4):
            for _ in range(2):
                done = client.completions.create(model=SERVED_MODEL, prompt=_preamble(i), max_tokens=2)
                details = done.usage.prompt_tokens_details if done.usage else None
                cached.append(details.cached_tokens if details else None)
    finally:
        client.close()
    records = rec.wait("generate", 8)
    assert len(records) == 8
    # The gateway named a rank on every request, and vLLM's DP routing kept to it.
    assert all(r["data_parallel_rank"] in (0, 1) for r in records)
    assert [r["engine"] for r in records] == [r["data_parallel_rank"] for r in records]
    # Each prompt's second request went to the engine that holds its prefix, and hit.
    for i in range(4):
        first, second = records[2 * i], records[2 * i + 1]
        assert second["engine"] == first["engine"]
        assert cached[2 * i] == 0 and cached[2 * i + 1] and cached[2 * i + 1] >= 192


def test_unpinned_vllm_spreads_an_idle_burst_so_pinning_is_what_keeps_the_prefix(
    vllm_dp_http: Process,
) -> None:
    """vLLM's own DP routing, asked without a rank, rotates idle engines: the same prompt
    twice lands on both, and the second misses. The gateway's pin is what avoids that."""
    rec = _recording(vllm_dp_http)
    url = vllm_dp_http.extra["url"] + "/v1/completions"
    prompt = list(range(2000, 2300))
    with httpx.Client(timeout=60) as http:
        for _ in range(2):
            reply = http.post(url, json={"model": SERVED_MODEL, "prompt": prompt, "max_tokens": 1})
            assert reply.status_code == 200
    first, second = rec.wait("generate", 2)
    assert first["data_parallel_rank"] is None and second["data_parallel_rank"] is None
    assert first["engine"] != second["engine"]


def _send_straight(server: Process, prompt: list[int], rank: int) -> None:
    """A prompt sent to vLLM itself (not through the gateway), pinned to ``rank``."""
    url = server.extra["url"]
    if url.startswith("http"):
        reply = httpx.post(
            url + "/v1/completions", json={"model": SERVED_MODEL, "prompt": prompt, "max_tokens": 1},
            headers={"X-data-parallel-rank": str(rank)}, timeout=60,
        )
        assert reply.status_code == 200, reply.text
        return
    import grpc

    from gateway.proto import sglang_scheduler_pb2 as pb
    from gateway.proto import vllm_engine_pb2_grpc
    from gateway.workers.vllm_grpc_wire import generate_request

    request = pb.GenerateRequest(
        request_id=f"straight-{rank}-{prompt[0]}", stream=False, data_parallel_rank=rank,
        sampling_params=pb.SamplingParams(temperature=1.0, n=1, max_new_tokens=1),
    )
    request.tokenized.input_ids.extend(prompt)
    with grpc.insecure_channel(url.removeprefix("grpc://")) as channel:
        replies = list(vllm_engine_pb2_grpc.VllmEngineStub(channel).Generate(generate_request(request), timeout=60))
    assert replies[-1].WhichOneof("response") == "complete"


def test_each_ranks_kv_events_teach_that_ranks_tree(dp_front: Process) -> None:
    """vLLM's own publishers, one per engine (rank N at the endpoint's port + N, which the
    gateway binds on 127.0.0.1): a prompt sent straight to one engine is learned by that
    rank's share of the gateway's tree, and by no other."""
    server = dp_front.extra["worker"]
    rec = _recording(dp_front)
    inspect = dp_front.extra["url"] + "/admin/inspect"
    workers = {w["dp_rank"]: w for w in httpx.get(dp_front.extra["url"] + "/workers", timeout=10).json()["workers"]}
    base = int(server.extra["kv_events"].rsplit(":", 1)[1])
    for rank, row in workers.items():
        assert row["kv_events_source"] == f"tcp://127.0.0.1:{base + rank}" and "kv_events" not in row["lacks"]
        assert row["kv_events"]["connected"] and not row["kv_events"]["stopped"], row["kv_events"]

    def learned(prompt: list[int]) -> dict[int, int]:
        rows = httpx.post(inspect, json={"input_ids": prompt}, timeout=30).json()["workers"]
        return {int(r["worker_id"].rsplit("@", 1)[1]): int(r["raw_match_tokens"]) for r in rows}

    offset = 5000 if server.extra["url"].startswith("http") else 6000  # each transport's own prompts
    for rank in (1, 0):
        prompt = [offset + 1000 * rank + k for k in range(200)]
        assert learned(prompt) == {0: 0, 1: 0}
        _send_straight(server, prompt, rank)
        (record,) = rec.wait("generate", 1)
        assert record["engine"] == rank
        rec.mark()
        deadline, got = time.monotonic() + 15, learned(prompt)
        while got[rank] == 0 and time.monotonic() < deadline:
            time.sleep(0.1)
            got = learned(prompt)
        assert got == {rank: 192, 1 - rank: 0}  # the prompt's three whole 64-token blocks, on its engine's rank
    feeds = {w["dp_rank"]: w["kv_events"] for w in httpx.get(dp_front.extra["url"] + "/workers", timeout=10).json()["workers"]}
    assert all(f["batches"] >= 1 and f["malformed"] == 0 and f["wrong_rank"] == 0 for f in feeds.values()), feeds
