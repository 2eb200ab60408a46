"""The zero-cost workers' vLLM face: the same worker as ``zero_fleet``'s gRPC one,
answering as vLLM's OpenAI server does.

Why a second vLLM HTTP worker beside the simulator's (``gateway_lab/sim/http_server.py``
with ``api="vllm"``): a claim about the gateway's vLLM HTTP client must hold on two
differently built fleets. This one shares no code with the simulator (aiohttp's web
server, no step loop, no servicer) and is written from vLLM's documented API:
``POST /v1/completions`` with a token-id (or text) prompt, ``return_token_ids`` (the
generated ids on each choice, the prompt's on a choice's first streamed chunk),
``stream_options`` (``include_usage``: a closing choiceless chunk with the usage, the
only one with ``prompt_tokens_details.cached_tokens``; ``continuous_usage_stats``: token
counts on every chunk), ``X-data-parallel-rank`` (one engine here: rank 0);
``GET /v1/models``, ``/health``, ``/metrics`` and ``POST /reset_prefix_cache``. No SGLang
route answers, so a gateway detects it as vLLM. ``/metrics`` is a page of the size a
vLLM server serves (its request gauges and prefix-cache counters beside the latency and
size histograms it keeps per model), since a gateway that polls loads from it reads all
of it each time. Each streamed event is its own write, as a server that generates one
token at a time sends it.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import orjson
from aiohttp import web
from tokenizers import Tokenizer

from gateway_lab.bench.zero_http import BadRequest, ZeroFace, ZeroWorker, json_response

DP_RANK_HEADER = "X-data-parallel-rank"

# Histograms a vLLM server keeps per model, with bucket bounds of the same shape and count.
_SECONDS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0)
_TOKENS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000, 50000)
_HISTOGRAMS = (
    ("vllm:time_to_first_token_seconds", _SECONDS), ("vllm:inter_token_latency_seconds", _SECONDS),
    ("vllm:e2e_request_latency_seconds", _SECONDS), ("vllm:request_queue_time_seconds", _SECONDS),
    ("vllm:request_inference_time_seconds", _SECONDS), ("vllm:request_prefill_time_seconds", _SECONDS),
    ("vllm:request_decode_time_seconds", _SECONDS), ("vllm:request_prompt_tokens", _TOKENS),
    ("vllm:request_generation_tokens", _TOKENS), ("vllm:iteration_tokens_total", _TOKENS),
    ("vllm:request_max_num_generation_tokens", _TOKENS), ("vllm:request_params_max_tokens", _TOKENS),
)  # fmt: skip


def parse_completion(body: Any, tokenizer: Tokenizer, context_length: int) -> dict[str, Any]:
    """A ``/v1/completions`` body as ``ids``, ``max_tokens``, ``n``, ``stream``,
    ``include_usage``, ``continuous`` and ``return_token_ids``, or BadRequest."""
    if not isinstance(body, dict):
        raise BadRequest("the body must be a JSON object")
    prompt = body.get("prompt")
    if isinstance(prompt, str) and prompt:
        ids = tokenizer.encode(prompt, add_special_tokens=False).ids
    elif isinstance(prompt, list) and prompt and all(type(t) is int and t >= 0 for t in prompt):
        ids = prompt
    else:
        raise BadRequest("prompt must be a non-empty string or list of token ids")
    max_tokens = body.get("max_tokens")
    max_tokens = 16 if max_tokens is None else max_tokens  # vLLM's completions default
    n = body.get("n")
    n = 1 if n is None else n
    if type(max_tokens) is not int or max_tokens < 0 or type(n) is not int or n < 1:
        raise BadRequest("max_tokens must be a count and n at least 1")
    if len(ids) + max_tokens > context_length:
        raise BadRequest(
            f"This model's maximum context length is {context_length} tokens. However, you requested "
            f"{len(ids) + max_tokens} tokens ({len(ids)} in the messages, {max_tokens} in the completion)."
        )
    options = body.get("stream_options") or {}
    if not isinstance(options, dict):
        raise BadRequest("stream_options must be an object")
    return {
        "ids": ids, "max_tokens": max_tokens, "n": n, "stream": bool(body.get("stream", False)),
        "include_usage": bool(options.get("include_usage")), "continuous": bool(options.get("continuous_usage_stats")),
        "return_token_ids": bool(body.get("return_token_ids")),
    }  # fmt: skip


def usage(prompt: int, completion: int, cached: int | None) -> dict[str, Any]:
    """vLLM's usage object; ``cached`` None leaves out ``prompt_tokens_details`` (per-chunk usage)."""
    out: dict[str, Any] = {"prompt_tokens": prompt, "total_tokens": prompt + completion, "completion_tokens": completion}
    if cached is not None:
        out["prompt_tokens_details"] = {"cached_tokens": cached}
    return out


def metrics_page(running: int, capacity_tokens: int, page_size: int, model: str) -> str:
    """The Prometheus text of ``/metrics``: what a gateway reads (running and waiting
    requests, the KV pool) amid the rest of what vLLM exports."""
    labels = f'engine="0",model_name="{model}"'
    lines = [
        "# HELP vllm:num_requests_running Number of requests in model execution batches.",
        "# TYPE vllm:num_requests_running gauge", f"vllm:num_requests_running{{{labels}}} {float(running)}",
        "# HELP vllm:num_requests_waiting Number of requests waiting to be processed.",
        "# TYPE vllm:num_requests_waiting gauge", f"vllm:num_requests_waiting{{{labels}}} 0.0",
        "# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.",
        "# TYPE vllm:kv_cache_usage_perc gauge", f"vllm:kv_cache_usage_perc{{{labels}}} 0.0",
        "# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig",
        "# TYPE vllm:cache_config_info gauge",
        f'vllm:cache_config_info{{block_size="{page_size}",enable_prefix_caching="True",engine="0",'
        f'num_gpu_blocks="{capacity_tokens // page_size}"}} 1.0',
    ]  # fmt: skip
    for name in ("prefix_cache_queries", "prefix_cache_hits", "prompt_tokens", "generation_tokens", "num_preemptions"):
        lines += [f"# TYPE vllm:{name}_total counter", f"vllm:{name}_total{{{labels}}} 0.0"]
    lines.append("# TYPE vllm:request_success_total counter")
    lines += [f'vllm:request_success_total{{{labels},finished_reason="{r}"}} 0.0' for r in ("stop", "length", "abort")]
    for name, bounds in _HISTOGRAMS:
        lines.append(f"# TYPE {name} histogram")
        lines += [f'{name}_bucket{{{labels},le="{float(b)}"}} 0.0' for b in bounds]
        lines += [f'{name}_bucket{{{labels},le="+Inf"}} 0.0', f"{name}_count{{{labels}}} 0.0", f"{name}_sum{{{labels}}} 0.0"]
    return "\n".join(lines) + "\n"


def _error(message: str, status: int = 400) -> web.Response:
    kind = "BadRequestError" if status == 400 else "InternalServerError"
    return json_response({"object": "error", "message": message, "type": kind, "param": None, "code": status}, status)


class ZeroVllmWorker(ZeroFace):
    """vLLM's OpenAI routes over one zero-cost worker (its cache, output and record)."""

    owned_by = "vllm"

    def app(self) -> web.Application:
        app = web.Application(client_max_size=64 << 20)
        app.router.add_post("/v1/completions", self.completions)
        app.router.add_get("/v1/models", self.models)
        app.router.add_get("/health", self.health)
        app.router.add_get("/metrics", self.metrics)
        app.router.add_post("/reset_prefix_cache", self.reset_prefix_cache)
        return app

    async def completions(self, request: web.Request) -> web.StreamResponse:
        w = self.worker
        rank = request.headers.get(DP_RANK_HEADER)
        if rank is not None and rank.strip() not in ("0", ""):
            return _error(f"data_parallel_rank {rank} is out of range [0, 1)")
        try:
            asked = parse_completion(orjson.loads(await request.read()), self.tokenizer, w.context_length)
        except (BadRequest, orjson.JSONDecodeError) as exc:
            return _error(str(exc))
        ids, max_new, n = asked["ids"], asked["max_tokens"], asked["n"]
        cached = w.admit(ids)
        tokens = w.tokens(max_new)
        head = {"id": f"cmpl-{time.monotonic_ns()}", "object": "text_completion", "created": int(time.time()), "model": self.model}
        with_ids = asked["return_token_ids"]
        w.running += 1
        try:
            await w.prefill(len(ids) - cached)
            if not asked["stream"]:
                if w.step_s:
                    await asyncio.sleep(w.step_s * max_new)
                text = "".join(self._text(t) for t in tokens)
                choices = []
                for index in range(n):
                    choice: dict[str, Any] = {
                        "index": index, "text": text, "logprobs": None, "finish_reason": "length", "stop_reason": None,
                    }  # fmt: skip
                    if with_ids:
                        choice |= {"prompt_token_ids": ids, "token_ids": tokens}
                    choices.append(choice)
                return json_response({**head, "choices": choices, "usage": usage(len(ids), n * max_new, cached)})
            response = web.StreamResponse(headers={"content-type": "text/event-stream", "cache-control": "no-cache"})
            await response.prepare(request)
            for done, token in enumerate(tokens, 1):
                if w.step_s:
                    await asyncio.sleep(w.step_s)
                for index in range(n):
                    part: dict[str, Any] = {
                        "index": index, "text": self._text(token), "logprobs": None,
                        "finish_reason": "length" if done == max_new else None, "stop_reason": None,
                    }  # fmt: skip
                    if with_ids:
                        if done == 1:
                            part["prompt_token_ids"] = ids
                        part["token_ids"] = [token]
                    event: dict[str, Any] = {**head, "choices": [part]}
                    if asked["continuous"]:
                        event["usage"] = usage(len(ids), done, None)
                    await response.write(b"data: " + orjson.dumps(event) + b"\n\n")
            if asked["include_usage"]:
                closing = {**head, "choices": [], "usage": usage(len(ids), n * max_new, cached)}
                await response.write(b"data: " + orjson.dumps(closing) + b"\n\n")
            await response.write(b"data: [DONE]\n\n")
            await response.write_eof()
            return response
        finally:
            w.running -= 1

    async def health(self, request: web.Request) -> web.Response:
        return web.Response()

    async def metrics(self, request: web.Request) -> web.Response:
        w = self.worker
        page = metrics_page(w.running, w.capacity_tokens, w.cache.page_size, self.model)
        return web.Response(text=page, content_type="text/plain", charset="utf-8")

    async def reset_prefix_cache(self, request: web.Request) -> web.Response:
        self.worker.cache.clear()
        return web.Response()


async def start(worker: ZeroWorker, port: int, tokenizer: Tokenizer | None = None) -> web.AppRunner:
    """Serve ``worker`` as vLLM on 127.0.0.1:``port``; the runner stops it. ``tokenizer``
    (default: the model folder's) reads text prompts; pass one to share it between workers."""
    tokenizer = tokenizer or Tokenizer.from_file(str(worker.folder / "tokenizer.json"))
    runner = web.AppRunner(ZeroVllmWorker(worker, tokenizer).app(), access_log=None, handle_signals=False)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    return runner


__all__ = ["DP_RANK_HEADER", "ZeroVllmWorker", "metrics_page", "parse_completion", "start", "usage"]
