#!/usr/bin/env python
"""Cross-check our load driver against a standard one (NVIDIA aiperf) on one setup.

    python -m venv /tmp/aiperf && /tmp/aiperf/bin/pip install aiperf   # its own venv: heavy deps
    .venv/bin/python scripts/bench_aiperf_crosscheck.py --aiperf /tmp/aiperf/bin/aiperf

A simulated fleet (``sim-worker``, default simulated costs: the figures are set by the
simulated GPU time, not by this machine) and one ``token-gateway serve`` in front of
it. The same prompts (written once, as our trace and as aiperf's ``single_turn`` input
file) are sent as streamed chat requests with a fixed output length (``ignore_eos``) at
the same concurrency, first by our driver (``gateway_lab.bench.driver``), then by aiperf,
offline: aiperf gets the Qwen3 tokenizer files from the local path, no hub. Printed:
requests/s, output tokens/s, TTFT p50 and end-to-end latency p50 from each.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import subprocess
import tempfile
from pathlib import Path

from gateway_lab.bench.driver import DriverConfig, run_workload
from gateway_lab.bench.machine import describe
from gateway_lab.bench.report import summarize
from gateway_lab.bench.serve_process import ServeProcess
from gateway_lab.bench.workloads import RequestSpec, Workload
from gateway_lab.sim.config import SimConfig
from gateway_lab.sim.fleet import SubprocessFleet
from gateway_lab.sim.vocab import default_tokenizer_path

WORDS = ("alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike november "
         "oscar papa quebec romeo sierra tango uniform victor whiskey xray yankee zulu").split()


def prompts(n: int, words: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return [f"request {i}: " + " ".join(rng.choice(WORDS) for _ in range(words)) for i in range(n)]


def ours(url: str, texts: list[str], args: argparse.Namespace) -> dict[str, float]:
    specs = [RequestSpec(endpoint="chat", max_tokens=args.output_tokens,
                         messages=({"role": "user", "content": t},)) for t in texts]
    run = asyncio.run(run_workload(url, Workload("crosscheck", specs), DriverConfig(concurrency=args.concurrency)))
    ok = [r for r in run.results if r.ok]
    s = summarize(run)
    return {"requests": len(ok), "errors": len(run.results) - len(ok), "req_per_s": len(ok) / run.wall_s,
            "output_tok_per_s": s.completion_tokens / run.wall_s, "ttft_p50_ms": (s.ttft_p50_s or 0) * 1e3,
            "latency_p50_ms": statistics.median(r.latency_s for r in ok) * 1e3}


def theirs(url: str, texts: list[str], args: argparse.Namespace, scratch: Path) -> dict[str, float]:
    data = scratch / "aiperf_input.jsonl"
    data.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    out = scratch / "aiperf"
    argv = [args.aiperf, "profile", "--model", args.model, "--url", url, "--endpoint-type", "chat", "--streaming",
            "--tokenizer", str(default_tokenizer_path()), "--input-file", str(data),
            "--custom-dataset-type", "single_turn", "--request-count", str(len(texts)),
            "--concurrency", str(args.concurrency), "--extra-inputs", f"max_tokens:{args.output_tokens}",
            "--extra-inputs", "ignore_eos:true", "--extra-inputs", "temperature:0", "--random-seed", "0",
            "--ui-type", "none", "--artifact-dir", str(out), "--warmup-request-count", "8",
            "--max-workers", str(args.aiperf_workers)]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=args.timeout_s,
                          env={"PATH": "/usr/bin:/bin", "HOME": tempfile.gettempdir()})
    if done.returncode != 0:
        raise SystemExit(f"aiperf failed ({done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    summary = json.loads(next(out.rglob("profile_export_aiperf.json")).read_text())

    def metric(name: str, stat: str = "avg") -> float:
        value = summary[name]
        return float(value[stat] if isinstance(value, dict) else value)

    return {"requests": metric("request_count"), "errors": metric("error_request_count") if "error_request_count" in summary else 0,
            "req_per_s": metric("request_throughput"), "output_tok_per_s": metric("output_token_throughput"),
            "ttft_p50_ms": metric("time_to_first_token", "p50"), "latency_p50_ms": metric("request_latency", "p50")}


async def start(args: argparse.Namespace) -> tuple[SubprocessFleet, ServeProcess]:
    fleet = SubprocessFleet(args.workers, SimConfig()).start()
    gw = await ServeProcess.start(fleet.urls, "cache_aware", extra_args=["--no-access-log", "--log-level", "warning"])
    return fleet, gw


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--aiperf", required=True, help="path of the aiperf executable")
    p.add_argument("--requests", type=int, default=200)
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--output-tokens", type=int, default=64)
    p.add_argument("--prompt-words", type=int, default=150)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--model", default="qwen3-sim")
    p.add_argument("--timeout-s", type=float, default=600)
    p.add_argument("--aiperf-workers", type=int, default=1, help="aiperf worker processes (2 cores here: one)")
    args = p.parse_args()
    print(describe())
    texts = prompts(args.requests, args.prompt_words, 0)
    loop = asyncio.new_event_loop()
    fleet, gw = loop.run_until_complete(start(args))
    try:
        with tempfile.TemporaryDirectory(prefix="aiperf-crosscheck-") as scratch:
            warm = ours(gw.url, prompts(16, args.prompt_words, 1), args)  # chat template compiled, caches warm alike
            del warm
            a = ours(gw.url, texts, args)
            b = theirs(gw.url, texts, args, Path(scratch))
    finally:
        loop.run_until_complete(gw.stop())
        loop.close()
        fleet.stop()
    print(f"{'':18}{'ours':>12}{'aiperf':>12}{'ratio':>8}")
    for key in ("requests", "errors", "req_per_s", "output_tok_per_s", "ttft_p50_ms", "latency_p50_ms"):
        ratio = f"{a[key] / b[key]:.3f}" if b[key] else "-"
        print(f"{key:18}{a[key]:12.2f}{b[key]:12.2f}{ratio:>8}")


if __name__ == "__main__":
    main()
