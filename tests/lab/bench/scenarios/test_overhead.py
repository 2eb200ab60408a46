"""`token-gateway bench overhead` (gateway_lab.bench.scenarios.overhead): its profile accounting, its prompts, and one tiny real run
(a simulated worker process and a gateway process; no timing is asserted)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

COMMAND = [sys.executable, "-m", "gateway", "bench", "overhead"]


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    from gateway_lab.bench.scenarios import overhead

    return overhead


def test_stage_of_takes_the_innermost_known_frame(bench: ModuleType) -> None:
    loop = "thread (1): MainThread;run (asyncio/runners.py:118)"
    app = loop + ";run (gateway/server/http/app.py:134);_answer (gateway/endpoints/chat.py:110)"
    assert bench.stage_of(app + ";Engine.render_chat (gateway/pipeline/engine.py:93);ChatTemplate.render (gateway/tokenization/chat_template.py:185)") == "template"
    assert bench.stage_of(app + ";open_generate (gateway/pipeline/dispatch.py:160);_send (grpc/aio/_call.py:667)") == "dispatch (gRPC)"
    assert bench.stage_of("thread (7): tokenize_0;_worker (concurrent/futures/thread.py:81)") == "tokenize"
    assert bench.stage_of("thread (9): Thread-1 (_poll_wrapper);Thread.run (threading.py:982)") == "dispatch (gRPC)"
    assert bench.stage_of(loop) == "event loop / other"


def test_summarize_profile_shares_add_up(bench: ModuleType, tmp_path: Path) -> None:
    raw = tmp_path / "p.txt"
    raw.write_text(
        "thread (1): MainThread;StreamChunk.to_json (gateway/protocol/stream.py:156) 30\n"
        "thread (1): MainThread;Generation._feed (gateway/pipeline/generation.py:170) 50\n"
        "thread (2): tokenize_0;Tokenizer.encode_batch (gateway/tokenization/tokenizer.py:236) 20\n"
    )
    summary = bench.summarize_profile(raw)
    assert summary["samples"] == 100
    assert summary["stage_percent"] == {"relay (detok, stops, chunks)": 50.0, "sse encode": 30.0, "tokenize": 20.0}
    assert summary["top_self_percent"][0] == (50.0, "Generation._feed (gateway/pipeline/generation.py:170)")


def test_prompts_are_unique_and_about_the_asked_length(bench: ModuleType) -> None:
    prompts = bench.Prompts(seed=1)
    (m1, ids1), (m2, ids2) = prompts.make(2048), prompts.make(2048)
    assert m1 != m2
    for ids in (ids1, ids2):
        assert 1600 < len(ids) < 2500


def test_pct_interpolates(bench: ModuleType) -> None:
    assert bench.pct([1.0, 2.0, 3.0, 4.0], 0.5) == 2.5
    assert bench.pct([5.0], 0.99) == 5.0


@pytest.mark.slow
def test_tiny_run_reports_every_figure(tmp_path: Path) -> None:
    out = tmp_path / "overhead.json"
    argv = [
        *COMMAND, "--sections", "latency", "throughput", "stream",
        "--latency-requests", "3", "--requests", "48", "--concurrency", "4",
        "--streams", "2", "--stream-tokens", "20", "--prompt-tokens", "512", "--cap-s", "20",
        "--json", str(out),
    ]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, timeout=180, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(out.read_text())
    non_stream, stream = report["latency"]
    assert non_stream["pairs"] == stream["pairs"] == 3
    assert non_stream["total_gateway_p50_ms"] > 0 and non_stream["total_direct_p50_ms"] > 0
    assert stream["ttft_gateway_p50_ms"] <= stream["total_gateway_p50_ms"]
    assert report["throughput"]["requests"] == 48
    assert report["throughput"]["gateway_cpu_ms_per_request"] > 0
    assert report["stream"]["tokens"] == 2 * 20  # every token relayed (ignore_eos)


def test_compare_table_gives_median_range_and_ratio(bench: ModuleType) -> None:
    rows = [
        {"gateway": "ours", "workers": 8, "rep": 1, "idle_core_percent": 0.2, "short": {"requests_per_s": 100.0, "cpu_ms_per_request": 2.0}},
        {"gateway": "smg", "workers": 8, "rep": 1, "idle_core_percent": 0.6, "short": {"requests_per_s": 200.0, "cpu_ms_per_request": 1.0}},
        {"gateway": "ours", "workers": 8, "rep": 2, "idle_core_percent": 0.4, "short": {"requests_per_s": 120.0, "cpu_ms_per_request": 3.0}},
        {"gateway": "smg", "workers": 8, "rep": 2, "idle_core_percent": 0.6, "short": {"requests_per_s": 220.0, "cpu_ms_per_request": 1.5}},
    ]
    table = bench.compare_table(rows, ["ours", "smg"]).markdown()
    assert table[0] == "| figure | ours | smg | ours / smg |"
    cpu = next(line for line in table if "128 in flight: CPU" in line)
    assert cpu == "| short, 128 in flight: CPU ms/request | 2.5 (2-3) | 1.25 (1-1.5) | 2.00x |"
    idle = next(line for line in table if line.startswith("| idle"))
    assert "(8 workers)" in idle and "0.3 (0.2-0.4)" in idle
    assert not any("gsp" in line for line in table)  # loads that did not run have no line


def test_usage_reads_openai_and_missing_details(bench: ModuleType) -> None:
    assert bench._usage(None) == (0, 0, 0)
    usage = {"prompt_tokens": 10, "completion_tokens": 3, "prompt_tokens_details": {"cached_tokens": 8}}
    assert bench._usage(usage) == (3, 10, 8)
    assert bench._usage({"prompt_tokens": 1, "completion_tokens": 2, "prompt_tokens_details": None}) == (2, 1, 0)


@pytest.mark.slow
def test_tiny_compare_run_reports_every_load(tmp_path: Path) -> None:
    out = tmp_path / "compare.json"
    argv = [
        *COMMAND, "--sections", "compare", "--gateways", "ours",
        "--short-workers", "2", "--short-requests", "10", "--short-warm", "0", "--short-concurrency", "4", "--latency-requests", "3",
        "--chat-conversations", "2", "--chat-turns", "2", "--chat-system-tokens", "64", "--chat-user-tokens", "16",
        "--chat-reply-tokens", "4", "--chat-concurrency", "2",
        "--gsp-workers", "2", "--gsp-groups", "1", "--gsp-prompts-per-group", "3", "--gsp-system-tokens", "64",
        "--gsp-question-tokens", "8", "--gsp-output-tokens", "5", "--gsp-concurrency", "3",
        "--idle-s", "0.5", "--cap-s", "20", "--json", str(out),
    ]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, timeout=240, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    rows = json.loads(out.read_text())["compare"]["rows"]
    short, gsp = rows
    assert short["short"]["requests"] == 10 and short["c1"]["requests"] == short["c1-stream"]["requests"] == 3
    for key in ("c1-raw", "c1-raw-stream"):  # the cheapest clients, beside aiohttp's figures
        raw = short[key]
        assert raw["requests"] == 3 and raw["direct"] in ("sync", "aio")
        assert raw["gateway_p50_ms"] > 0 and raw["direct_sync_p50_ms"] > 0 and raw["direct_aio_p50_ms"] > 0
    # Process CPU is read from /proc in 10 ms clock ticks: four tiny chat turns, or three
    # gsp requests, may fit in none of them on a quiet machine, so the CPU figures are only
    # required to be there (and never negative).
    assert short["multi-turn"]["requests"] == 4 and short["multi-turn"]["cpu_ms_per_request"] >= 0
    assert gsp["gsp"]["requests"] == 3 and gsp["gsp"]["tokens_per_event"] >= 1.0
    assert gsp["gsp"]["cpu_us_per_token"] >= 0 and "idle_core_percent" in gsp


def test_relay_code_runs_the_hot_path_in_process(bench: ModuleType) -> None:
    """The relay section's in-process figure drives the real stream loop: a head, one
    event per token with text, and [DONE] reach the (null) ASGI send."""
    import asyncio

    out = asyncio.run(bench.relay_code_us_per_token(bench.Prompts(0), 16, 2))
    assert out["relay_us_per_token"] > 0 and out["protobuf_parse_us_per_message"] > 0
    chat = asyncio.run(bench.relay_code_us_per_token(bench.Prompts(0), 16, 2, chat=True))
    # The role chunk goes out in the first text's write: as many sends as a completion stream.
    assert chat["relay_us_per_token"] > 0 and chat["asgi_messages_per_stream"] == out["asgi_messages_per_stream"]
    assert 16 / 2 + 2 <= out["asgi_messages_per_stream"] <= 16 + 2


def test_profiler_commands(bench: ModuleType, tmp_path: Path) -> None:
    out = tmp_path / "p.txt"
    spy = bench.profiler_command("py-spy", 42, out, 200, True)
    assert "--nonblocking" in spy and "--gil" in spy and spy[spy.index("--pid") + 1] == "42"
    native = bench.profiler_command("py-spy-native", 42, out, 200, False)
    assert "--native" in native and "--nonblocking" not in native and "--gil" not in native
    assert bench.profiler_command("perf", 42, out, 499, True) == ["perf", "record", "-F", "499", "-g", "-p", "42", "-o", str(out)]


def test_raw_http_reads_content_length_and_chunked_answers(bench: ModuleType) -> None:
    """The raw client reads a whole answer to its Content-Length and a stream to the
    chunked body's end, on one keep-alive connection, with TTFT at the first text event."""
    import socket
    import threading

    whole = b'{"choices":[{"message":{"content":"hi"}}]}'
    events = [b'data: {"choices":[{"delta":{"role":"assistant","content":""}}]}\n\n',
              b'data: {"choices":[{"delta":{"content":"hi"}}]}\n\n', b"data: [DONE]\n\n"]
    chunked = b"".join(b"%x\r\n%s\r\n" % (len(e), e) for e in events) + b"0\r\n\r\n"
    answers = [
        b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n%s" % (len(whole), whole),
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n" + chunked,
        b"HTTP/1.1 400 Bad Request\r\ncontent-length: 2\r\n\r\n{}",
    ]
    server = socket.create_server(("127.0.0.1", 0))
    seen: list[bytes] = []

    def serve() -> None:
        conn, _ = server.accept()
        with conn:
            for answer in answers:
                data = b""
                while b"\r\n\r\n" not in data:
                    data += conn.recv(65536)
                head, _, body = data.partition(b"\r\n\r\n")
                length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
                while len(body) < length:
                    body += conn.recv(65536)
                seen.append(body)
                conn.sendall(answer)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    client = bench.RawHttp(f"http://127.0.0.1:{server.getsockname()[1]}")
    try:
        total, ttft = client.roundtrip(client.request("/x", b'{"a":1}'))
        assert 0 < ttft <= total
        total, ttft = client.roundtrip(client.request("/x", b'{"b":2}'))
        assert 0 < ttft <= total
        with pytest.raises(RuntimeError, match="400"):
            client.roundtrip(client.request("/x", b"{}"))
    finally:
        client.close()
        thread.join(5)
        server.close()
    assert seen == [b'{"a":1}', b'{"b":2}', b"{}"]


def test_tiny_start_run_drives_the_app_in_process(tmp_path: Path) -> None:
    """The start section sends every burst's requests through the real app and engine with
    in-memory worker streams: each answered, every lease given back, and the prompt cache's
    misses counted (cold cache: each group's new system prompt at least once per burst)."""
    out = tmp_path / "start.json"
    argv = [
        *COMMAND, "--sections", "start", "--gsp-workers", "2", "--gsp-groups", "2",
        "--gsp-prompts-per-group", "3", "--gsp-system-tokens", "600", "--gsp-question-tokens", "8",
        "--gsp-output-tokens", "3", "--start-bursts", "2", "--json", str(out),
    ]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, timeout=240, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    start = json.loads(out.read_text())["start"]
    assert start["requests"] == 12 and start["bursts"] == 2 and len(start["cpu_ms_per_request_bursts"]) == 2
    assert start["statuses"] == {"200": 18}  # the warm burst and the two measured ones
    assert start["in_flight_after"] == 0
    assert 2 <= start["prompt_cache_misses_per_burst"] <= 6  # at least one per group, at most one per prompt
    # CPU comes in 10 ms clock ticks: twelve tiny requests may fit in none, so it is only required
    # to be there (and never negative).
    assert start["cpu_ms_per_request"] >= 0 and all(v > 0 for v in start["thread_cpu_ms_per_request"].values())


def test_compare_rounds_alternate_the_gateways_order(bench: ModuleType) -> None:
    assert bench.round_order(["ours", "before", "smg"], 1) == ["ours", "before", "smg"]
    assert bench.round_order(["ours", "before", "smg"], 2) == ["smg", "before", "ours"]
    assert bench.round_order(["ours"], 4) == ["ours"]
