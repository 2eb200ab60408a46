"""The zero-cost workers' SGLang HTTP face: the same worker as ``zero_fleet``'s gRPC one,
answering SGLang's native HTTP API.

Why a second HTTP worker beside the simulator's (``gateway_lab/sim/http_server.py``):
a claim about the gateway's HTTP worker client must hold on two differently built
fleets. This one shares no code with the simulator: aiohttp's web server instead of
Starlette on uvicorn, no step loop, no servicer behind it. It answers what SGLang's HTTP
server answers: ``POST /generate`` with ``input_ids`` (whole, or SSE-streamed with the
output so far in each event, SGLang's default, then ``data: [DONE]``), ``GET /health``,
``/health_generate``, ``/get_model_info``, ``/get_server_info``, ``/get_load`` (a list of
per-rank loads), ``POST /flush_cache`` and ``/abort_request``; and the OpenAI routes
SGLang's server has, for gateways that send text (SMG's HTTP router): ``GET /v1/models``,
``POST /v1/completions`` and ``/v1/chat/completions``, whole or streamed, with ``usage``
(``prompt_tokens_details.cached_tokens``). Text is tokenized with the model folder's
tokenizer, a chat with the ChatML turns the Qwen3 template writes, so both kinds of
gateway fill and hit the same prefix cache. Each streamed event is its own write, as a
server that generates one token at a time sends it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

import orjson
from aiohttp import web
from tokenizers import Tokenizer

DEFAULT_MAX_NEW_TOKENS = 128


class Cache(Protocol):
    page_size: int

    def clear(self) -> None: ...


class ZeroWorker(Protocol):
    """What this face needs of ``zero_fleet.ZeroWorker`` (which imports this module)."""

    folder: Path
    step_s: float
    capacity_tokens: int
    context_length: int
    running: int
    started: float
    version: str

    @property
    def cache(self) -> Cache: ...

    def admit(self, prompt: Sequence[int]) -> int: ...

    async def prefill(self, uncached: int) -> None: ...

    def tokens(self, n: int) -> list[int]: ...


class BadRequest(ValueError):
    """A body SGLang's server would refuse with HTTP 400."""


def json_response(value: Any, status: int = 200) -> web.Response:
    return web.Response(body=orjson.dumps(value), status=status, content_type="application/json")


def _error(message: str, status: int = 400) -> web.Response:
    return json_response({"error": {"message": message}}, status)


def parse_generate(body: Any, context_length: int) -> tuple[list[int], int, int, bool, str]:
    """``(input_ids, max_new_tokens, n, stream, rid)`` of a ``/generate`` body, or BadRequest."""
    if not isinstance(body, dict):
        raise BadRequest("the body must be a JSON object")
    ids = body.get("input_ids")
    if not isinstance(ids, list) or not ids or not all(isinstance(t, int) and t >= 0 for t in ids):
        raise BadRequest("input_ids must be a non-empty list of token ids")
    params = body.get("sampling_params")
    params = {} if params is None else params
    if not isinstance(params, dict):
        raise BadRequest("sampling_params must be an object")
    max_new = params.get("max_new_tokens")
    max_new = DEFAULT_MAX_NEW_TOKENS if max_new is None else max_new
    n = params.get("n", 1)
    if not isinstance(max_new, int) or max_new < 0 or not isinstance(n, int) or n < 1:
        raise BadRequest("max_new_tokens must be a count and n at least 1")
    if len(ids) + max_new > context_length:
        raise BadRequest("the prompt plus max_new_tokens exceeds the context")
    return ids, max_new, n, bool(body.get("stream", False)), str(body.get("rid") or "")


def answer(rid: str, output: list[int], index: int, prompt: int, cached: int, done: bool) -> dict[str, Any]:
    """One SGLang answer object: the output so far and its counts."""
    meta = {
        "id": rid, "finish_reason": {"type": "length", "matched": None} if done else None,
        "prompt_tokens": prompt, "completion_tokens": len(output), "cached_tokens": cached,
    }  # fmt: skip
    return {"text": "", "output_ids": output, "meta_info": meta, "index": index}


def chat_prompt(messages: Any) -> str:
    """The ChatML text of a chat (Qwen's turns), ready for the assistant's reply."""
    if not isinstance(messages, list) or not messages:
        raise BadRequest("messages must be a non-empty list")
    turns = []
    for m in messages:
        if not isinstance(m, dict) or not isinstance(m.get("content"), str):
            raise BadRequest("each message needs a role and a text content")
        turns.append(f"<|im_start|>{m.get('role', 'user')}\n{m['content']}<|im_end|>\n")
    return "".join(turns) + "<|im_start|>assistant\n"


def parse_openai(body: Any, tokenizer: Tokenizer, context_length: int, chat: bool) -> tuple[list[int], int, bool, bool]:
    """``(prompt ids, max_tokens, stream, include_usage)`` of an OpenAI body, or BadRequest."""
    if not isinstance(body, dict):
        raise BadRequest("the body must be a JSON object")
    if chat:
        ids = tokenizer.encode(chat_prompt(body.get("messages")), add_special_tokens=False).ids
    else:
        prompt = body.get("prompt")
        if isinstance(prompt, str) and prompt:
            ids = tokenizer.encode(prompt, add_special_tokens=False).ids
        elif isinstance(prompt, list) and prompt and all(isinstance(t, int) and t >= 0 for t in prompt):
            ids = prompt
        else:
            raise BadRequest("prompt must be a non-empty string or list of token ids")
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    max_tokens = 16 if max_tokens is None else max_tokens
    if not isinstance(max_tokens, int) or max_tokens < 0:
        raise BadRequest("max_tokens must be a count")
    if len(ids) + max_tokens > context_length:
        raise BadRequest("the prompt plus max_tokens exceeds the context")
    options = body.get("stream_options") or {}
    return ids, max_tokens, bool(body.get("stream", False)), bool(isinstance(options, dict) and options.get("include_usage"))


def usage(prompt: int, completion: int, cached: int) -> dict[str, Any]:
    return {
        "prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": cached},
    }  # fmt: skip


class ZeroFace:
    """What every HTTP face of one :class:`ZeroWorker` shares: the worker, its tokenizer,
    each reply token's text decoded once, and the model card it lists."""

    owned_by = "zero"

    def __init__(self, worker: ZeroWorker, tokenizer: Tokenizer, model: str = "zero") -> None:
        self.worker = worker
        self.tokenizer = tokenizer
        self.model = model
        self._texts: dict[int, str] = {}

    def _text(self, token: int) -> str:
        text = self._texts.get(token)
        if text is None:
            text = self._texts[token] = self.tokenizer.decode([token])
        return text

    async def models(self, request: web.Request) -> web.Response:
        w = self.worker
        card = {"id": self.model, "object": "model", "owned_by": self.owned_by, "root": str(w.folder),
                "max_model_len": w.context_length}  # fmt: skip
        return json_response({"object": "list", "data": [card]})


class ZeroHttpWorker(ZeroFace):
    """SGLang's HTTP routes over one :class:`ZeroWorker` (its cache, output and record)."""

    def app(self) -> web.Application:
        app = web.Application(client_max_size=64 << 20)
        app.router.add_post("/generate", self.generate)
        for path in ("/health", "/health_generate"):
            app.router.add_get(path, self.health)
        app.router.add_get("/get_model_info", self.model_info)
        app.router.add_get("/get_server_info", self.server_info)
        app.router.add_get("/get_load", self.load)
        app.router.add_post("/flush_cache", self.flush)
        app.router.add_post("/abort_request", self.abort)
        app.router.add_get("/v1/models", self.models)
        app.router.add_post("/v1/completions", self.completions)
        app.router.add_post("/v1/chat/completions", self.chat_completions)
        return app

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._openai(request, chat=False)

    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        return await self._openai(request, chat=True)

    async def _openai(self, request: web.Request, chat: bool) -> web.StreamResponse:
        w = self.worker
        try:
            ids, max_new, stream, include_usage = parse_openai(
                orjson.loads(await request.read()), self.tokenizer, w.context_length, chat,
            )  # fmt: skip
        except (BadRequest, orjson.JSONDecodeError) as exc:
            return _error(str(exc))
        cached = w.admit(ids)
        texts = [self._text(t) for t in w.tokens(max_new)]
        kind = "chat.completion" if chat else "text_completion"
        head = {"id": f"zero-{time.monotonic_ns()}", "created": int(time.time()), "model": "zero"}
        w.running += 1
        try:
            await w.prefill(len(ids) - cached)
            if not stream:
                if w.step_s:
                    await asyncio.sleep(w.step_s * max_new)
                text = "".join(texts)
                choice: dict[str, Any] = {"index": 0, "finish_reason": "length", "logprobs": None}
                choice |= {"message": {"role": "assistant", "content": text}} if chat else {"text": text}
                return json_response({**head, "object": kind, "choices": [choice], "usage": usage(len(ids), max_new, cached)})
            response = web.StreamResponse(headers={"content-type": "text/event-stream", "cache-control": "no-cache"})
            await response.prepare(request)
            for done, piece in enumerate(texts, 1):
                if w.step_s:
                    await asyncio.sleep(w.step_s)
                finish = "length" if done == max_new else None
                part: dict[str, Any] = {"index": 0, "finish_reason": finish, "logprobs": None}
                part |= {"delta": {"role": "assistant", "content": piece} if done == 1 else {"content": piece}} if chat else {"text": piece}
                event = {**head, "object": kind + ".chunk" if chat else kind, "choices": [part]}
                await response.write(b"data: " + orjson.dumps(event) + b"\n\n")
            if include_usage:
                event = {**head, "object": kind + ".chunk" if chat else kind, "choices": [], "usage": usage(len(ids), max_new, cached)}
                await response.write(b"data: " + orjson.dumps(event) + b"\n\n")
            await response.write(b"data: [DONE]\n\n")
            await response.write_eof()
            return response
        finally:
            w.running -= 1

    async def generate(self, request: web.Request) -> web.StreamResponse:
        w = self.worker
        try:
            ids, max_new, n, stream, rid = parse_generate(orjson.loads(await request.read()), w.context_length)
        except (BadRequest, orjson.JSONDecodeError) as exc:
            return _error(str(exc))
        cached = w.admit(ids)
        tokens = w.tokens(max_new)
        w.running += 1
        try:
            await w.prefill(len(ids) - cached)
            if not stream:
                if w.step_s:
                    await asyncio.sleep(w.step_s * max_new)
                whole = [answer(rid, tokens, i, len(ids), cached, True) for i in range(n)]
                return json_response(whole[0] if n == 1 else whole)
            response = web.StreamResponse(headers={"content-type": "text/event-stream", "cache-control": "no-cache"})
            await response.prepare(request)
            for done in range(1, max_new + 1):
                if w.step_s:
                    await asyncio.sleep(w.step_s)
                for index in range(n):
                    event = answer(rid, tokens[:done], index, len(ids), cached, done == max_new)
                    await response.write(b"data: " + orjson.dumps(event) + b"\n\n")
            await response.write(b"data: [DONE]\n\n")
            await response.write_eof()
            return response
        finally:
            w.running -= 1

    async def health(self, request: web.Request) -> web.Response:
        return web.Response(text="")

    async def model_info(self, request: web.Request) -> web.Response:
        folder = str(self.worker.folder)
        return json_response({
            "model_path": folder, "tokenizer_path": folder, "is_generation": True,
            "served_model_name": "zero", "weight_version": "default", "preferred_sampling_params": None,
        })  # fmt: skip

    async def server_info(self, request: web.Request) -> web.Response:
        w = self.worker
        folder = str(w.folder)
        return json_response({
            "model_path": folder, "tokenizer_path": folder, "served_model_name": "zero",
            "page_size": w.cache.page_size, "context_length": w.context_length, "skip_tokenizer_init": False,
            "max_total_num_tokens": w.capacity_tokens, "dp_size": 1, "version": w.version,
            "internal_states": [{"max_total_num_tokens": w.capacity_tokens, "page_size": w.cache.page_size}],
            "uptime_seconds": time.time() - w.started,
        })  # fmt: skip

    async def load(self, request: web.Request) -> web.Response:
        return json_response([{"dp_rank": 0, "num_reqs": self.worker.running, "num_waiting_reqs": 0, "num_tokens": 0}])

    async def flush(self, request: web.Request) -> web.Response:
        self.worker.cache.clear()
        return web.Response(text="Cache flushed.\n")

    async def abort(self, request: web.Request) -> web.Response:
        return web.Response(text="")


async def start(worker: ZeroWorker, port: int, tokenizer: Tokenizer | None = None) -> web.AppRunner:
    """Serve ``worker`` over HTTP on 127.0.0.1:``port``; the runner stops it. ``tokenizer``
    (default: the model folder's) reads text prompts; pass one to share it between workers."""
    tokenizer = tokenizer or Tokenizer.from_file(str(worker.folder / "tokenizer.json"))
    runner = web.AppRunner(ZeroHttpWorker(worker, tokenizer).app(), access_log=None, handle_signals=False)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    return runner


__all__ = ["BadRequest", "ZeroHttpWorker", "answer", "chat_prompt", "parse_generate", "parse_openai", "start", "usage"]
