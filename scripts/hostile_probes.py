"""Hostile probes against a real gateway process: /health latency, answers and RSS.

Four hostile workers run in this process over real gRPC on loopback (each serving its
own model name): ``bomb`` sends a chat template full of template bombs (picked per
request with ``chat_template_kwargs``), ``flood`` answers every Generate with 300,000
tokens, ``endless`` streams one token every millisecond for ever, ``oversize`` answers
with one 32 MiB message. The gateway under test
is ``token-gateway serve`` in a child process; /health is polled every 20 ms by another
child process on its own kept-alive connection (TCP_NODELAY), so neither the workers'
nor the client's work in this process slows what is measured. RSS is the gateway
process's VmRSS (before, after each probe) and VmHWM (its peak) from /proc.

Run from the repository root: ``PYTHONPATH=. .venv/bin/python scripts/hostile_probes.py
[--port-base 21220] [--json]``; it prints one Markdown row per probe.

``--render-cost-against DIR`` instead measures what the render budget costs an honest
render: this checkout's ``ChatTemplate`` against the one in ``DIR`` (another checkout's
``src/gateway/tokenization``, e.g. the commit before the budget), loaded side by side in
this process and timed in alternating rounds (CPU time, the minimum per side), on the
Qwen3 template and four conversations; both must render the same text.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import multiprocessing
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx

from tests.e2e.hostile_worker import HostilePlan, hostile_worker
from tests.tokenization.helpers import copy_tokenizer, qwen_files

BOMBS = {
    "nested range(100000) loops": "{% for i in range(100000) %}{% for j in range(100000) %}x{% endfor %}{% endfor %}",
    "'x' * 10^9": "{{ 'x' * 1000000000 }}",
    "9 ** (9 ** 9)": "{{ 9 ** (9 ** 9) }}",
    "self-recursive macro": "{% macro f(x) %}{{ f(x) }}{% endmacro %}{{ f(1) }}",
    "string doubled 60 times": (
        "{% set ns = namespace(x='ab') %}{% for i in range(60) %}{% set ns.x = ns.x ~ ns.x %}{% endfor %}"
    ),
    "shared list doubled 30 times, printed": (
        "{% set ns = namespace(x=['abc']) %}{% for i in range(30) %}{% set ns.x = [ns.x, ns.x] %}{% endfor %}"
        "{{ ns.x }}"
    ),
    "constant 'x'|center(10^9)": "{{ 'x'|center(1000000000) }}",
}
ONLY = ""  # --only: run the probes whose name contains this

OVERSIZE = 32 << 20
"""Bytes of the one message the ``oversize`` worker answers every Generate with."""

MIN_PROBE_S = 2.0
"""Each probe repeats its attack for at least this long, so /health is polled ~100 times."""

# Inside the step and byte budgets, writing nothing: each of 3,000 steps serializes the
# messages as JSON and drops it (the work budget stops it).
SLOW = "{% for i in range(3000) %}{% if (messages|tojson|length) < 0 %}x{% endif %}{% endfor %}"


def _template() -> str:
    branches = [(f"b{i}", source) for i, source in enumerate(BOMBS.values())] + [("slow", SLOW)]
    body = "".join(f"{{% if bomb == '{key}' %}}{source}{{% endif %}}" for key, source in branches)
    honest = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    return body + "{% if bomb is not defined %}" + honest + "<|im_start|>assistant\n{% endif %}"


def _bomb_tokenizer(dest: Path) -> Path:
    folder = copy_tokenizer(qwen_files(), dest)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config["chat_template"] = _template()
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return folder


# ------------------------------------------------------------------ /health prober
def _probe_health(port: int, ready: Any, stop: Any, out: Any, every_s: float = 0.02) -> None:
    """Child process: GET /health every ``every_s`` on one kept-alive connection; sends the
    latencies (seconds; a failed or 10 s answer counts as its wait) when ``stop`` is set.
    ``ready`` is set once its connection answered (what came before is not measured)."""
    latencies: list[float] = []
    request = b"GET /health HTTP/1.1\r\nHost: probe\r\n\r\n"
    sock: socket.socket | None = None
    while not stop.is_set():
        started = time.perf_counter()
        try:
            if sock is None:
                sock = socket.create_connection(("127.0.0.1", port), timeout=10)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.sendall(request)
            data = b""
            while b"\r\n\r\n" not in data:
                data += sock.recv(65536) or b""
            head, _, body = data.partition(b"\r\n\r\n")
            length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                           if line.lower().startswith(b"content-length")), 0)
            while len(body) < length:
                body += sock.recv(65536)
        except OSError:
            if sock is not None:
                sock.close()
            sock = None
        if ready.is_set():
            latencies.append(time.perf_counter() - started)
        elif sock is not None:
            ready.set()
        time.sleep(every_s)
    out.put(latencies)


@contextlib.asynccontextmanager
async def health_probe(port: int) -> AsyncIterator[list[float]]:
    ctx = multiprocessing.get_context("spawn")
    ready, stop, out = ctx.Event(), ctx.Event(), ctx.Queue()
    proc = ctx.Process(target=_probe_health, args=(port, ready, stop, out), daemon=True)
    proc.start()
    await asyncio.to_thread(ready.wait, 60)
    result: list[float] = []
    try:
        yield result
    finally:
        stop.set()
        result.extend(await asyncio.to_thread(out.get, True, 30))
        proc.join(10)


def _rss(pid: int) -> tuple[float, float]:
    """(VmRSS, VmHWM) of ``pid`` in MiB."""
    fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line)
    return int(fields["VmRSS"].split()[0]) / 1024, int(fields["VmHWM"].split()[0]) / 1024


def _p(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


# ---------------------------------------------------------------------- the probes
async def _chat(http: httpx.AsyncClient, model: str, **body: Any) -> httpx.Response:
    body.setdefault("messages", [{"role": "user", "content": "hi"}])
    return await http.post("/v1/chat/completions", json={"model": model, **body})


def _code(resp: httpx.Response) -> str:
    if resp.status_code == 200:
        return "200"
    error = resp.json().get("error", {})
    return f"{resp.status_code} {error.get('code') or error.get('type')}"


async def run(port_base: int) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        folder = _bomb_tokenizer(Path(tmp) / "bomb-tokenizer")
        async with contextlib.AsyncExitStack() as stack:
            bomb = await stack.enter_async_context(hostile_worker(
                HostilePlan(), tokenizer_path=str(folder), served_model_name="bomb"))
            flood = await stack.enter_async_context(hostile_worker(
                HostilePlan(flood_tokens=300_000), served_model_name="flood"))
            endless = await stack.enter_async_context(hostile_worker(
                HostilePlan(endless=True), served_model_name="endless"))
            oversize = await stack.enter_async_context(hostile_worker(
                HostilePlan(flood_tokens=10, chunk_tokens=10, padding=OVERSIZE), served_model_name="oversize"))
            port = port_base
            gateway = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "gateway", "serve", "--worker-urls", bomb, flood, endless, oversize,
                "--port", str(port), "--tokenizer-cache-dir", str(Path(tmp) / "cache"), "--log-level", "error",
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            )
            try:
                async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=60) as http:
                    for _ in range(600):
                        with contextlib.suppress(httpx.HTTPError):
                            if (await http.get("/readiness")).status_code == 200:
                                break
                        await asyncio.sleep(0.1)
                    await _chat(http, "bomb")  # warm: the template compiled, the first request's costs paid
                    rows += [row for row in await _probes(http, port, gateway.pid) if row is not None]
            finally:
                gateway.terminate()
                await asyncio.wait_for(gateway.wait(), 20)
    return rows


async def _measure(
    port: int, pid: int, name: str, attempt: Callable[[], Awaitable[str]], times: int = 1
) -> dict[str, Any] | None:
    if ONLY and ONLY not in name:
        return None
    rss_before, _ = _rss(pid)
    answers: list[str] = []
    took: list[float] = []
    async with health_probe(port) as lat:
        begun = time.perf_counter()
        while len(answers) < times or time.perf_counter() - begun < MIN_PROBE_S:
            started = time.perf_counter()
            answers.append(await attempt())
            took.append(time.perf_counter() - started)
        await asyncio.sleep(0.2)
    rss_after, peak = _rss(pid)
    row = {
        "probe": name, "answer": max(set(answers), key=answers.count), "times": len(answers),
        "answer_ms": statistics.median(took) * 1000,
        "health_p50_ms": _p(lat, 0.5) * 1000, "health_p99_ms": _p(lat, 0.99) * 1000,
        "health_max_ms": max(lat) * 1000 if lat else float("nan"), "polls": len(lat),
        "rss_mib": rss_after, "rss_growth_mib": rss_after - rss_before, "peak_mib": peak,
    }
    print(json.dumps(row), file=sys.stderr, flush=True)
    return row


async def _probes(http: httpx.AsyncClient, port: int, pid: int) -> list[dict[str, Any] | None]:
    rows: list[dict[str, Any] | None] = []

    async def idle() -> str:
        await asyncio.sleep(2.0)
        return "-"

    rows.append(await _measure(port, pid, "nothing hostile (baseline)", idle))
    for i, name in enumerate(BOMBS):
        async def bomb(key: str = f"b{i}") -> str:
            return _code(await _chat(http, "bomb", max_tokens=4, chat_template_kwargs={"bomb": key}))
        rows.append(await _measure(port, pid, f"template bomb: {name}", bomb, times=20))

    async def slow() -> str:
        return _code(await _chat(http, "bomb", max_tokens=4, chat_template_kwargs={"bomb": "slow"},
                                 messages=[{"role": "user", "content": "x" * 800_000}]))
    rows.append(await _measure(port, pid, "template serializing an 800 KB conversation in a loop, writing nothing", slow, times=2))

    async def honest_flood() -> str:
        replies = await asyncio.gather(*(_chat(http, "bomb", max_tokens=8) for _ in range(200)))
        return "200 x200" if all(r.status_code == 200 for r in replies) else ",".join({_code(r) for r in replies})
    rows.append(await _measure(port, pid, "200 honest chat requests at once", honest_flood, times=3))

    async def bomb_flood() -> str:
        replies = await asyncio.gather(*(_chat(http, "bomb", max_tokens=4, chat_template_kwargs={"bomb": "b0"})
                                         for _ in range(200)))
        return ",".join(sorted({_code(r) for r in replies})) + " x200"
    rows.append(await _measure(port, pid, "200 template bombs at once", bomb_flood, times=3))

    async def flooded(stream: bool = False) -> str:
        body = {"model": "flood", "prompt": "hello", "max_tokens": 40}
        if not stream:
            reply = (await http.post("/v1/completions", json=body)).json()
            return f"completion_tokens {reply['usage']['completion_tokens']}"
        tokens = 0
        async with http.stream("POST", "/v1/completions", json={
                **body, "stream": True, "stream_options": {"include_usage": True}}) as resp:
            async for line in resp.aiter_lines():
                if line.startswith("data: {"):
                    usage = json.loads(line[6:]).get("usage")
                    tokens = usage["completion_tokens"] if usage else tokens
        return f"completion_tokens {tokens}"
    rows.append(await _measure(port, pid, "worker sends 300,000 tokens for max_tokens 40", flooded, times=5))
    rows.append(await _measure(port, pid, "same, streamed", lambda: flooded(True), times=5))

    async def endless_stream() -> str:
        reply = (await http.post("/v1/completions", json={"model": "endless", "prompt": "hi", "max_tokens": 16})).json()
        return f"completion_tokens {reply['usage']['completion_tokens']}"
    rows.append(await _measure(port, pid, "worker streams for ever, max_tokens 16", endless_stream, times=5))

    async def oversized() -> str:
        return _code(await http.post("/v1/completions", json={"model": "oversize", "prompt": "hi", "max_tokens": 40}))
    rows.append(await _measure(port, pid, "worker answers with one 32 MiB message, max_tokens 40", oversized, times=5))

    async def amplified() -> str:
        return _code(await _chat(http, "bomb", n=128, max_tokens=200, logprobs=True, top_logprobs=20))
    rows.append(await _measure(port, pid, "n 128, top_logprobs 20 (154-byte request)", amplified, times=5))
    return rows


def render_cost(other: Path, rounds: int = 15) -> None:
    """Print CPU per render, this checkout's ``ChatTemplate`` against ``other``'s."""
    import types

    def load(name: str, path: Path, replace: tuple[tuple[str, str], ...] = ()) -> types.ModuleType:
        source = path.read_text()
        for old, new in replace:
            source = source.replace(old, new)
        module = types.ModuleType(name)
        module.__file__ = str(path)
        sys.modules[name] = module
        exec(compile(source, str(path), "exec"), module.__dict__)
        return module

    swaps: tuple[tuple[str, str], ...] = ()
    if (other / "render_budget.py").exists():  # the budget as one module: load that one too
        load("other_render_budget", other / "render_budget.py")
        swaps = (("from gateway.tokenization.render_budget import", "from other_render_budget import"),
                 ("from gateway.tokenization import render_budget", "import other_render_budget as render_budget"))
    load("other_sandbox", other / "sandbox.py", swaps)
    older = load("other_chat_template", other / "chat_template.py",
                 (("from gateway.tokenization.sandbox import", "from other_sandbox import"), *swaps))
    from gateway.tokenization import Tokenizer
    from gateway.tokenization.chat_template import ChatTemplate
    from tests.tokenization.test_chat_template import (
        MULTI_TURN_REASONING,
        SYSTEM,
        TIME_TOOL,
        TOOL_TURN,
        WEATHER_TOOL,
    )

    source = Tokenizer.from_path(qwen_files(), name="qwen3").chat_template().source
    new, old = ChatTemplate(source), older.ChatTemplate(source)
    history = [SYSTEM] + [{"role": r, "content": f"message number {i} " * 5} for i in range(20) for r in ("user", "assistant")]
    cases = {
        "system + user": ([SYSTEM, {"role": "user", "content": "Hi there, how are you?"}], {}),
        "tool turn, 2 tools": (TOOL_TURN, {"tools": [WEATHER_TOOL, TIME_TOOL]}),
        "4 turns with reasoning": (MULTI_TURN_REASONING, {}),
        "41 messages": (history, {}),
    }
    print("| conversation | before | with the budget | ratio |")
    print("| --- | --- | --- | --- |")
    for name, (messages, options) in cases.items():
        assert new.render(messages, **options) == old.render(messages, **options)
        n = max(20, 4000 // (len(messages) + 2 * len(options.get("tools", [])) + 2))
        best = {"old": float("inf"), "new": float("inf")}
        for _ in range(rounds):
            for side, template in (("old", old), ("new", new)):
                started = time.process_time()
                for _ in range(n):
                    template.render(messages, **options)
                best[side] = min(best[side], (time.process_time() - started) / n)
        print(f"| {name} | {best['old'] * 1e6:.1f} us | {best['new'] * 1e6:.1f} us | x{best['new'] / best['old']:.3f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port-base", type=int, default=21220, help="the gateway's HTTP port")
    parser.add_argument("--json", action="store_true", help="print the rows as JSON instead of Markdown")
    parser.add_argument("--only", default="", help="run only the probes whose name contains this text")
    parser.add_argument("--render-cost-against", type=Path, metavar="DIR",
                        help="measure the render budget's cost against another checkout's src/gateway/tokenization")
    args = parser.parse_args()
    global ONLY
    ONLY = args.only
    if args.render_cost_against:
        render_cost(args.render_cost_against)
        return
    rows = asyncio.run(run(args.port_base))
    if args.json:
        print(json.dumps(rows, indent=1))
        return
    print("| probe | answer | answer time (median) | /health p50 | /health p99 | /health max | RSS after | RSS growth |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        print(f"| {r['probe']} | {r['answer']} (x{r['times']}) | {r['answer_ms']:.1f} ms | {r['health_p50_ms']:.1f} ms "
              f"| {r['health_p99_ms']:.1f} ms | {r['health_max_ms']:.1f} ms | {r['rss_mib']:.0f} MiB "
              f"| {r['rss_growth_mib']:+.0f} MiB |")
    print(f"\npeak RSS (VmHWM) {max(r['peak_mib'] for r in rows):.0f} MiB", file=sys.stdout)


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()
