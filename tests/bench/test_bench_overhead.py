"""scripts/bench_overhead.py: its profile accounting, its prompts, and one tiny real run
(a simulated worker process and a gateway process; no timing is asserted)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "bench_overhead.py"


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_overhead", SCRIPT)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules["bench_overhead"] = mod
    spec.loader.exec_module(mod)
    return mod


def test_stage_of_takes_the_innermost_known_frame(bench: ModuleType) -> None:
    loop = "thread (1): MainThread;run (asyncio/runners.py:118)"
    app = loop + ";run (gateway/server/http/app.py:134);complete_chat (gateway/endpoints/chat.py:110)"
    assert bench.stage_of(app + ";Engine.render_chat (gateway/pipeline/engine.py:93);ChatTemplate.render (gateway/tokenization/chat_template.py:185)") == "template"
    assert bench.stage_of(app + ";open_generate (gateway/pipeline/dispatch.py:160);_send (grpc/aio/_call.py:667)") == "dispatch (gRPC)"
    assert bench.stage_of("thread (7): tokenize_0;_worker (concurrent/futures/thread.py:81)") == "tokenize"
    assert bench.stage_of("thread (9): Thread-1 (_poll_wrapper);Thread.run (threading.py:982)") == "dispatch (gRPC)"
    assert bench.stage_of(loop) == "event loop / other"


def test_summarize_profile_shares_add_up(bench: ModuleType, tmp_path: Path) -> None:
    raw = tmp_path / "p.txt"
    raw.write_text(
        "thread (1): MainThread;sse (gateway/server/sse.py:13) 30\n"
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
        sys.executable, str(SCRIPT), "--sections", "latency", "throughput", "stream",
        "--latency-requests", "3", "--requests", "12", "--concurrency", "4",
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
    assert report["throughput"]["requests"] == 12
    assert report["throughput"]["gateway_cpu_ms_per_request"] > 0
    assert report["stream"]["tokens"] == 2 * 20  # every token relayed (ignore_eos)
