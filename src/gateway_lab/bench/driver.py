"""Load driver: replays a workload against an OpenAI-compatible endpoint and times it.

Every request is streamed (``stream_options.include_usage``) so the driver can time
the first token and read the worker-reported usage, including
``prompt_tokens_details.cached_tokens``. Concurrency is bounded by a semaphore;
arrivals are either closed-loop (send when a slot frees) or timed (the specs'
``arrival_s``: Poisson or a trace). Runs are bounded in request count and wall time,
and cancelling the run (Ctrl-C) cancels every request in flight.

It speaks HTTP with ``httpx`` and reads the SSE lines itself instead of going through
the ``openai`` client: the client's per-chunk pydantic parsing costs more CPU than
the gateway under test gets on a small machine, and it hides response headers
(``x-worker-id``) on streams. The OpenAI stream format is just ``data: <json>`` lines.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import orjson

from gateway.protocol.headers import REQUEST_ID, WORKER_ID
from gateway.settings import option
from gateway_lab.bench.workloads import Message, RequestSpec, Workload, with_poisson_arrivals

if TYPE_CHECKING:  # httpx is imported where used: the CLI parser imports this module
    import httpx

WORKER_HEADER = WORKER_ID


@dataclass(slots=True)
class DriverConfig:
    """How hard and how long to drive a workload."""

    concurrency: int = option(32, "requests in flight at most")
    request_rate: float = option(0.0, "Poisson arrivals per second (0: closed loop, or trace times)")
    max_requests: int = option(0, "send at most this many requests (0: the whole workload)")
    duration_s: float = option(600.0, "stop the run after this many seconds of wall time")
    request_timeout_s: float = option(120.0, "give up on one request after this many seconds")
    model: str = option("", "model name to send (empty: the first of GET /v1/models)")
    temperature: float = option(0.0, "sampling temperature sent with every request")


@dataclass(slots=True)
class RequestResult:
    """What happened to one request (times in seconds; offsets from the run's start)."""

    index: int
    group: str
    ok: bool
    error: str | None = None
    start_s: float = 0.0
    ttft_s: float | None = None
    latency_s: float | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    worker_id: str | None = None
    text: str = ""  # the generated text (chat replies feed the next turn)
    messages: tuple[Message, ...] = ()  # chat: the full message list that was sent


@dataclass(slots=True)
class RunResult:
    """One workload run through one endpoint."""

    label: str
    workload: str
    results: list[RequestResult]
    wall_s: float
    planned: int  # requests the run meant to send (bounded by max_requests)
    worker_counters: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def not_sent(self) -> int:
        return self.planned - len(self.results)


class _Failure(Exception):
    """A request failed in a way worth one short line in the report."""


async def discover_model(client: httpx.AsyncClient, base_url: str) -> str:
    """The first model id the endpoint lists, or "default" if it lists none."""
    import httpx

    try:
        response = await client.get(f"{base_url}/v1/models")
        response.raise_for_status()
        data = response.json().get("data") or []
        return str(data[0]["id"]) if data else "default"
    except (httpx.HTTPError, ValueError, KeyError, TypeError):
        return "default"


def _lanes(requests: Sequence[RequestSpec]) -> list[list[tuple[int, RequestSpec]]]:
    """Independent requests get a lane each; a conversation's turns share one, in turn order."""
    lanes: list[list[tuple[int, RequestSpec]]] = []
    by_conversation: dict[str, list[tuple[int, RequestSpec]]] = {}
    for i, spec in enumerate(requests):
        if spec.conversation is None:
            lanes.append([(i, spec)])
        elif spec.conversation in by_conversation:
            by_conversation[spec.conversation].append((i, spec))
        else:
            lanes.append(by_conversation.setdefault(spec.conversation, [(i, spec)]))
    for lane in by_conversation.values():
        lane.sort(key=lambda item: item[1].turn)
    return lanes


def _body(
    spec: RequestSpec, messages: Sequence[Message], model: str, temperature: float
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": model,
        "max_tokens": spec.max_tokens,
        "temperature": temperature,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if spec.ignore_eos:
        body["ignore_eos"] = True
    if spec.endpoint == "chat":
        body["messages"] = [dict(m) for m in messages]
    else:
        ids = spec.prompt_token_ids
        body["prompt"] = list(ids) if ids is not None else spec.prompt
    return body


def _delta_text(choice: Mapping[str, Any]) -> str:
    if "text" in choice:
        return choice.get("text") or ""
    delta = choice.get("delta") or {}
    return (delta.get("content") or "") + (delta.get("reasoning_content") or "")


async def _stream_one(
    client: httpx.AsyncClient, url: str, body: dict[str, Any], result: RequestResult, t0: float,
    request_id: str | None = None,
) -> None:
    """Send one streaming request and fill ``result`` from its SSE chunks."""
    pieces: list[str] = []
    chunks = 0
    done = False
    headers = {"content-type": "application/json"}
    if request_id:
        headers[REQUEST_ID] = request_id
    async with client.stream("POST", url, content=orjson.dumps(body), headers=headers) as response:
        result.worker_id = response.headers.get(WORKER_HEADER)
        if response.status_code != 200:
            detail = (await response.aread()).decode(errors="replace")[:200]
            raise _Failure(f"HTTP {response.status_code}: {detail}")
        async for line in response.aiter_lines():
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                done = True
                break
            chunk = orjson.loads(data)
            if "error" in chunk:
                error = chunk["error"]
                message = error.get("message", error) if isinstance(error, dict) else error
                raise _Failure(str(message)[:200])
            for choice in chunk.get("choices") or ():
                text = _delta_text(choice)
                if text or choice.get("finish_reason") is None:
                    chunks += 1
                if text:
                    if result.ttft_s is None:
                        result.ttft_s = time.perf_counter() - t0
                    pieces.append(text)
            usage = chunk.get("usage")
            if usage:
                result.prompt_tokens = int(usage.get("prompt_tokens") or 0)
                result.completion_tokens = int(usage.get("completion_tokens") or 0)
                details = usage.get("prompt_tokens_details") or {}
                result.cached_tokens = int(details.get("cached_tokens") or 0)
    if not done:
        raise _Failure("stream ended without [DONE]")
    if result.ttft_s is None:  # an empty completion: its first token is its end
        result.ttft_s = time.perf_counter() - t0
    if not result.completion_tokens:
        result.completion_tokens = chunks
    result.text = "".join(pieces)


async def run_workload(
    base_url: str,
    workload: Workload,
    config: DriverConfig | None = None,
    *,
    label: str = "",
    on_result: Callable[[RequestResult], None] | None = None,
    client: httpx.AsyncClient | None = None,
    request_ids: Callable[[int], str] | None = None,
) -> RunResult:
    """Drive ``workload`` through the OpenAI endpoint at ``base_url`` and return every result.

    ``on_result`` is called as each request finishes (progress bars). Requests not sent
    when ``duration_s`` runs out are counted in ``RunResult.not_sent``; requests in
    flight at that moment are cancelled and reported as errors. ``request_ids``: request
    ``index`` is sent with ``X-Request-Id: request_ids(index)`` (the gateway passes it to
    the worker), so its decision and the worker's timeline can be joined to its result;
    the run's start on ``time.perf_counter`` is ``RunResult.meta["t0"]``.
    """
    import httpx

    config = config or DriverConfig()
    base_url = base_url.rstrip("/")
    requests = workload.requests[: config.max_requests] if config.max_requests > 0 else workload.requests
    if config.request_rate > 0:
        requests = with_poisson_arrivals(Workload(workload.name, requests), config.request_rate).requests
    own_client = client is None
    if client is None:
        slots = max(1, config.concurrency)
        client = httpx.AsyncClient(
            timeout=httpx.Timeout(config.request_timeout_s, connect=10.0),
            limits=httpx.Limits(max_connections=slots, max_keepalive_connections=slots),
            trust_env=False,  # the gateway is on loopback: never route through a proxy
        )
    results: list[RequestResult] = []
    semaphore = asyncio.Semaphore(max(1, config.concurrency))
    t0 = time.perf_counter()
    try:
        model = config.model or await discover_model(client, base_url)

        async def one(index: int, spec: RequestSpec, history: list[Message]) -> RequestResult:
            messages = (*history, *spec.messages) if spec.endpoint == "chat" else ()
            result = RequestResult(index=index, group=spec.group, ok=False, messages=tuple(messages))
            path = "/v1/chat/completions" if spec.endpoint == "chat" else "/v1/completions"
            async with semaphore:
                start = time.perf_counter()
                result.start_s = start - t0
                results.append(result)
                try:
                    body = _body(spec, messages, model, config.temperature)
                    async with asyncio.timeout(config.request_timeout_s):
                        await _stream_one(client, base_url + path, body, result, start,
                                          request_ids(index) if request_ids is not None else None)
                    result.ok = True
                except asyncio.CancelledError:
                    result.error = "cancelled"
                    raise
                except TimeoutError:
                    result.error = f"timeout after {config.request_timeout_s:g}s"
                except (_Failure, httpx.HTTPError, ValueError) as exc:
                    result.error = str(exc) or type(exc).__name__
                finally:
                    result.latency_s = time.perf_counter() - start
            if on_result is not None:
                on_result(result)
            return result

        async def lane(items: list[tuple[int, RequestSpec]]) -> None:
            history: list[Message] = []
            for index, spec in items:
                if spec.arrival_s is not None:
                    delay = t0 + spec.arrival_s - time.perf_counter()
                    if delay > 0:
                        await asyncio.sleep(delay)
                result = await one(index, spec, history)
                if not result.ok:
                    return  # later turns would resend a history this turn never got
                history = [*result.messages, {"role": "assistant", "content": result.text}]

        tasks = [asyncio.create_task(lane(items)) for items in _lanes(requests)]
        try:
            _, pending = await asyncio.wait(tasks, timeout=max(0.0, config.duration_s))
        finally:
            pending = {t for t in tasks if not t.done()}
            for task in pending:
                task.cancel()
            if pending:
                await asyncio.gather(*pending, return_exceptions=True)
    finally:
        if own_client:
            await client.aclose()
    wall = time.perf_counter() - t0
    for result in results:
        if result.error == "cancelled" and on_result is not None:
            on_result(result)
    results.sort(key=lambda r: r.index)
    return RunResult(
        label=label or workload.name,
        workload=workload.name,
        results=results,
        wall_s=wall,
        planned=len(requests),
        meta={"model": model, "concurrency": config.concurrency, "request_rate": config.request_rate, "t0": t0},
    )
