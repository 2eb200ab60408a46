"""Health, Abort and client disconnects, and SGLang behaviours the gateway must live with.

The pinned behaviours are read with an independent client on the official stubs
(``grpc_client``, its own process), straight against the servicer.
"""

from __future__ import annotations

import time
from typing import Any

import httpx

from tests.interop_sglang.conftest import run_grpc_client
from tests.interop_sglang.servers import Process, Recording

MESSAGES = [{"role": "user", "content": "Count to a million"}]


def test_gateway_health_and_worker_list(gateway: Process, sglang_grpc: Process) -> None:
    url = gateway.extra["url"]
    assert httpx.get(url + "/health", timeout=10).status_code == 200
    workers = httpx.get(url + "/workers", timeout=10).json()
    text = str(workers)
    assert str(sglang_grpc.extra["port"]) in text


def test_health_check_runs_a_one_token_generation(sglang_grpc: Process, recording: Recording) -> None:
    out = run_grpc_client(sglang_grpc.extra["port"], "health")
    assert out["healthy"] is True
    health = [r for r in recording.since_mark(keep_noise=True) if str(r["rid"]).startswith("HEALTH_CHECK_")]
    assert health and health[-1]["sampling_params"]["max_new_tokens"] == 1


def test_abort_rpc_reaches_the_scheduler_and_the_stream_never_ends(sglang_grpc: Process,
                                                                   recording: Recording) -> None:
    out = run_grpc_client(sglang_grpc.extra["port"], "abort")
    assert out["abort_success"] is True
    assert out["messages_before_abort"] >= 3
    # SGLang's behaviour, pinned: after Abort the Generate stream gets no end (no message, no status).
    assert out["ended"] is None
    assert any(a["rid"] == out["request_id"] for a in recording.wait("abort", 1))


def test_unary_n_returns_every_completion_with_index_zero(sglang_grpc: Process) -> None:
    out = run_grpc_client(sglang_grpc.extra["port"], "unary-n")
    assert out["complete_indexes"] == [0, 0]


def test_client_disconnect_aborts_at_the_worker(client: Any, model: str, recording: Recording) -> None:
    stream = client.chat.completions.create(model=model, messages=MESSAGES, max_tokens=30000, stream=True,
                                            extra_body={"ignore_eos": True})
    got = 0
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            got += 1
        if got >= 3:
            break
    stream.close()
    [rec] = recording.wait("generate", 1)
    aborts = recording.wait("abort", 1, timeout=15)
    assert any(rec["rid"].startswith(str(a["rid"])) or str(a["rid"]).startswith(rec["rid"]) for a in aborts), aborts
    t0 = time.monotonic()
    r = client.chat.completions.create(model=model, messages=MESSAGES, max_tokens=2)
    assert r.usage.completion_tokens == 2 and time.monotonic() - t0 < 10


def test_an_independent_grpc_client_sees_no_stall(sglang_grpc: Process) -> None:
    """The real servicer answers short non-streaming calls without a multi-second wait."""
    out = run_grpc_client(sglang_grpc.extra["port"], "latency", "64", "8")
    assert out["requests"] == 64
    assert out["over_1s"] == 0, out


def test_what_the_servicer_reports_about_the_model(sglang_grpc: Process) -> None:
    """Pinned: which GetModelInfo / GetServerInfo values are true and which are placeholders."""
    out = run_grpc_client(sglang_grpc.extra["port"], "info")
    # True: the model's generation defaults (generation_config.json) and the scheduler's input limit.
    assert out["default_sampling_params"] == {"temperature": 0.6, "top_k": 20, "top_p": 0.95}
    assert out["max_req_input_len"] == 40960 - 1 - 5
    # The KV pool size, not the model's 40,960-token context.
    assert out["max_context_length"] == out["max_total_num_tokens"] == 65536
    # Placeholders: keys the scheduler never sends.
    assert (out["vocab_size"], out["eos_token_ids"]) == (128256, [])
    # The raw argument, unresolved.
    assert out["page_size"] is None


def test_a_streams_complete_repeats_only_the_last_chunk(sglang_grpc: Process) -> None:
    """Pinned: count tokens from the chunks; the complete carries the last chunk's ids again."""
    out = run_grpc_client(sglang_grpc.extra["port"], "stream-end")
    assert [len(c) for c in out["chunks"]] == [1, 1, 1, 1, 1]
    assert out["complete"]["output_ids"] == out["chunks"][-1]
    assert (out["complete"]["finish_reason"], out["complete"]["completion_tokens"]) == ("length", 5)
