"""A ``WorkerTransport`` for vLLM's OpenAI server (``http://`` / ``https://`` workers).

vLLM is the most deployed engine; its OpenAI server takes the routed token ids as a
completion prompt and returns the ids it generated (``return_token_ids``), so the
policy routes on the same ids the worker caches, as with SGLang. The shapes are
translated in ``vllm_http_wire``; the session, errors and Generate call are the HTTP
worker machinery of ``sglang_http``.

What vLLM's server lacks is reported, not faked: no abort route (closing the request is
its abort), no tokenizer download, KV capacity and loads only from ``/metrics``, and
which runner it has only from the routes it serves.
Embeddings go to ``/v1/embeddings`` with the token ids as the input; vLLM serves that
route only for a pooling model (``--runner pooling``), and a server that does not
answers 404, which the call reports as UNIMPLEMENTED. vLLM's pooling routes do not read
the data-parallel header: an embedding goes to whichever engine vLLM picks. A server
started with data-parallel engines (``--data-parallel-size``) is one endpoint of several
ranks: ``/metrics`` labels each engine's series (``engine="N"``), which gives the ranks
and their loads, and a request names its rank in the ``X-data-parallel-rank`` header.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import orjson
from prometheus_client.parser import text_string_to_metric_families

from gateway.proto import common_pb2
from gateway.proto import sglang_scheduler_pb2 as pb
from gateway.workers.http_errors import http_status_error
from gateway.workers.sglang_http import AnswerReader, HttpGenerateCall, HttpWorkerClient
from gateway.workers.sglang_http_wire import AnswerError, body_json
from gateway.workers.transport import CallCode, WorkerCallError
from gateway.workers.vllm_http_wire import (
    CompletionStreamReader,
    completion_body,
    embedding_body,
    embedding_reply,
    whole_completion,
)


class VllmDialect:
    """vLLM's ``/v1/completions`` with a token-id prompt, for one served model name."""

    path = "/v1/completions"

    def __init__(self, model: str, context_length: int = 0) -> None:
        self.model = model
        self.context_length = context_length

    def body(self, request: pb.GenerateRequest) -> bytes:
        return body_json(completion_body(request, self.model, self.context_length))

    def reader(self, request: pb.GenerateRequest) -> AnswerReader:
        return CompletionStreamReader(request.request_id, _prompt_start(request), len(request.tokenized.input_ids))

    def whole(self, request: pb.GenerateRequest, answer: object) -> list[pb.GenerateResponse]:
        return whole_completion(request.request_id, answer, _prompt_start(request))


def _prompt_start(request: pb.GenerateRequest) -> int:
    """Where the prompt's logprobs start, -1 when the request asks for none."""
    return request.logprob_start_len if request.return_logprob else -1


_RUNNING = "vllm:num_requests_running"
_WAITING = "vllm:num_requests_waiting"
_CACHE_CONFIG = "vllm:cache_config_info"
DP_RANK_HEADER = "x-data-parallel-rank"
DEV_INFO_TIMEOUT_S = 3.0  # the most a probe waits for vLLM's development-mode /server_info
_READ = tuple(name.encode() for name in (_RUNNING, _WAITING, _CACHE_CONFIG))


def read_lines(content: bytes) -> str:
    """The sample lines of a ``/metrics`` page that the client reads. A vLLM server's page
    is mostly histograms (hundreds of lines per model) and is polled for loads several
    times a second; the Prometheus parser is pure Python, so it is given only these."""
    return "\n".join(
        line.decode("utf-8", "replace") for line in content.split(b"\n") if line.startswith(_READ)
    ) + "\n"


def _engine(sample: Any) -> int:
    """The data-parallel engine a ``/metrics`` sample belongs to (0 when unlabelled)."""
    label = sample.labels.get("engine", "0")
    return int(label) if label.isdigit() else 0


class VllmHttpClient(HttpWorkerClient):
    """The worker seam over one vLLM OpenAI server."""

    kind = "vllm/http"
    engine = "vLLM's OpenAI server"
    lacks = (HttpWorkerClient.lacks - {"embed"}) | {"abort"}

    def __init__(self, url: str, **kwargs: Any) -> None:
        super().__init__(url, **kwargs)
        self._dialect: VllmDialect = VllmDialect("")
        # vLLM's development-mode /server_info (its KV-event config): asked only for
        # ``--kv-events-zmq auto``, and no more once it answered that the route is missing.
        self._asks_server_info = self.kv_event_discovery
        # The development-mode route was asked and not answered within its bound: the KV-event
        # feeder asks the server info again, apart from the join (``workers.kv_events``).
        self.kv_events_report_pending = False

    def generate(self, request: pb.GenerateRequest, *, timeout: float | None = None) -> HttpGenerateCall:
        headers = self._headers(request.request_id)
        if request.HasField("data_parallel_rank"):
            headers[DP_RANK_HEADER] = str(request.data_parallel_rank)
        return HttpGenerateCall(self._http, self._dialect, request, headers, timeout)

    async def embed(self, request: pb.EmbedRequest, *, timeout: float | None = None) -> pb.EmbedResponse:
        """One embedding from ``/v1/embeddings`` (the routed ids as the input)."""
        body = body_json(embedding_body(request, self._dialect.model))
        headers = {**self._headers(request.request_id), "Content-Type": "application/json"}
        status, content = await self._call("POST", "/v1/embeddings", timeout or 60.0, body, headers)
        if status != 200:
            raise http_status_error(status, content)
        try:
            return embedding_reply(orjson.loads(content))
        except orjson.JSONDecodeError:
            raise WorkerCallError(CallCode.INTERNAL, "/v1/embeddings did not answer JSON") from None
        except AnswerError as exc:
            raise WorkerCallError(CallCode.INTERNAL, f"/v1/embeddings: {exc}") from None

    async def _model_card(self, timeout: float) -> dict[str, Any]:
        models = await self._get_json("/v1/models", timeout)
        data = models.get("data") if isinstance(models, dict) else None
        if not isinstance(data, list) or not data or not isinstance(data[0], dict) or not data[0].get("id"):
            raise WorkerCallError(CallCode.INTERNAL, "/v1/models lists no model")
        card: dict[str, Any] = data[0]
        if card.get("owned_by") == "sglang":  # SGLang's server answers this route too, with its name on the card
            raise WorkerCallError(
                CallCode.FAILED_PRECONDITION, f"{self.url} is SGLang's server (its /v1/models cards are owned_by sglang)"
            )
        length = card.get("max_model_len")
        # The name completions must carry, and the context that bounds a request with no cap.
        self._dialect = VllmDialect(str(card["id"]), length if isinstance(length, int) and length > 0 else 0)
        return card

    async def _generates(self, timeout: float) -> bool:
        """Whether the server runs a generation model. ``/v1/models`` does not say, but vLLM
        registers its text routes only for one (a pooling runner gets ``/v1/embeddings``
        and the like instead): a GET of ``/v1/completions``, a POST-only route, answers 405
        where the route exists and 404 where it does not. Any other answer says nothing,
        and generation is assumed, as before the probe."""
        status, _ = await self._call("GET", self._dialect.path, timeout)
        return status != 404

    async def model_info(self, *, timeout: float = 5.0) -> pb.GetModelInfoResponse:
        card = await self._model_card(timeout)
        length = card.get("max_model_len")
        return pb.GetModelInfoResponse(
            model_path=str(card.get("root") or card["id"]),
            tokenizer_path=str(card.get("root") or ""),
            is_generation=await self._generates(timeout),
            served_model_name=str(card["id"]),
            max_context_length=length if isinstance(length, int) else 0,
        )

    async def _metrics(self, timeout: float) -> list[Any]:
        """The samples of ``/metrics`` (Prometheus text) the client reads."""
        status, content = await self._call("GET", "/metrics", timeout)
        if status != 200:
            raise http_status_error(status, content)
        try:
            return [
                sample
                for family in text_string_to_metric_families(read_lines(content))
                for sample in family.samples
            ]
        except ValueError as exc:
            raise WorkerCallError(CallCode.INTERNAL, f"/metrics is not Prometheus text: {exc}") from None

    async def server_info(self, *, timeout: float = 5.0) -> pb.GetServerInfoResponse:
        """The served name, and the KV pool from ``vllm:cache_config_info`` (its
        ``num_gpu_blocks`` x ``block_size`` labels) when ``/metrics`` has it: the
        cache-aware budget follows the real capacity, pages are vLLM's blocks."""
        card = await self._model_card(timeout)
        args: dict[str, Any] = {"served_model_name": str(card["id"])}
        length = card.get("max_model_len")
        if isinstance(length, int) and length > 0:
            args["context_length"] = length  # vLLM's max_model_len is the model's context, not its KV pool
        capacity = 0
        try:
            samples = await self._metrics(timeout)
        except WorkerCallError:
            samples = []
        engines = {_engine(x) for x in samples if x.name == _RUNNING}
        if len(engines) > 1:  # one rank per data-parallel engine, each with its own KV pool
            args["dp_size"] = max(engines) + 1
        for sample in samples:
            if sample.name.startswith(_CACHE_CONFIG):
                blocks, size = sample.labels.get("num_gpu_blocks"), sample.labels.get("block_size")
                if blocks and size and blocks.isdigit() and size.isdigit():
                    capacity = int(blocks) * int(size)
                    args["page_size"] = int(size)
        kv_events = await self._kv_events_config(timeout)
        if kv_events is not None:
            args["kv_events_config"] = kv_events
        reply = pb.GetServerInfoResponse(server_type="vllm-http", max_total_num_tokens=capacity)
        reply.server_args.update(args)
        return reply

    async def _kv_events_config(self, timeout: float) -> dict[str, Any] | None:
        """vLLM's ``kv_events_config`` from ``/server_info?config_format=json``, which vLLM serves
        only in its development mode (``VLLM_SERVER_DEV_MODE=1``); without it the route is
        missing, asked once and not again, and the publisher must be named by the operator.
        Not asked at all unless the gateway reads publishers from reports (``kv_event_discovery``)."""
        if not self._asks_server_info:
            return None
        try:
            # Bounded apart: the route also collects the host's environment the first time (slow),
            # and the worker's join must not wait on it.
            status, content = await self._call("GET", "/server_info?config_format=json", min(timeout, DEV_INFO_TIMEOUT_S))
        except WorkerCallError:
            self.kv_events_report_pending = True  # vLLM goes on and keeps what it collected: ask again later
            return None
        self.kv_events_report_pending = False
        if status in (404, 405):
            self._asks_server_info = False
            return None
        try:
            config = orjson.loads(content).get("vllm_config") if status == 200 else None
        except (orjson.JSONDecodeError, AttributeError):
            return None
        found = config.get("kv_events_config") if isinstance(config, dict) else None
        return found if isinstance(found, dict) else None

    async def loads(self, *, timeout: float = 2.0, include: Sequence[str] = ("core",)) -> pb.GetLoadsResponse:
        """Running and waiting requests per data-parallel engine from the Prometheus text of ``/metrics``."""
        figures: dict[int, dict[str, float]] = {}
        for sample in await self._metrics(timeout):
            if sample.name in (_RUNNING, _WAITING):
                per = figures.setdefault(_engine(sample), {_RUNNING: 0.0, _WAITING: 0.0})
                per[sample.name] += sample.value
        loads = []
        for rank in sorted(figures) or [0]:
            per = figures.get(rank, {})
            running, waiting = int(per.get(_RUNNING, 0.0)), int(per.get(_WAITING, 0.0))
            loads.append(pb.SchedulerLoad(
                dp_rank=rank, num_running_reqs=running, num_waiting_reqs=waiting, num_total_reqs=running + waiting,
            ))
        return pb.GetLoadsResponse(
            timestamp=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), dp_rank_count=len(loads), loads=loads,
            aggregate=pb.AggregateMetrics(
                total_running_reqs=sum(x.num_running_reqs for x in loads),
                total_waiting_reqs=sum(x.num_waiting_reqs for x in loads),
                total_reqs=sum(x.num_total_reqs for x in loads),
            ),
        )

    async def abort(self, request_id: str, reason: str = "", *, timeout: float = 2.0) -> bool:
        return False  # no abort route: the cancelled call's closed connection aborts it

    async def flush_cache(self, timeout_s: float = 0.0, *, timeout: float = 30.0) -> common_pb2.FlushCacheResponse:
        status, content = await self._call("POST", "/reset_prefix_cache", timeout)
        message = content.decode("utf-8", "replace").strip() or f"HTTP {status}"
        return common_pb2.FlushCacheResponse(success=status == 200, message=message)


__all__ = ["DP_RANK_HEADER", "VllmDialect", "VllmHttpClient", "read_lines"]
