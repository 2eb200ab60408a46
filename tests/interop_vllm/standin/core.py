"""A stand-in for vLLM's engine core: what AsyncLLM talks to, with no model behind it.

vLLM's frontend (the OpenAI server, the smg-grpc-servicer ``VllmEngine`` servicer, and
AsyncLLM under both: input processing, detokenization, stop strings, logprobs, ``n>1``
fan-out, usage, Prometheus metrics) runs unchanged; only the engine-core client, which
would start a GPU engine process, is replaced by this class. Each step emits one token
per running request from the deterministic rule in ``tests.interop_sglang.standin.
fake_model``; whether a request stops is decided by vLLM's own ``check_stop`` on vLLM's
own ``Request``. A block-level prefix cache reports true cached-token counts, and every
step carries ``SchedulerStats``, so ``/metrics`` shows real running/waiting gauges. When the
config enables KV events (vLLM's ``--grpc`` launcher does by default), the cache's stores,
evictions and resets go out through vLLM's own ZMQ publisher, as the scheduler's would.
A pooling runner's requests (``--runner pooling``: embeddings) are answered in one step
with a deterministic unit vector of the prompt's ids. With ``--data-parallel-size`` N it
is N such engines behind the routing of vLLM's own
load-balancing DP client (``StandinCore``).

Runs only in the interop virtualenv (it imports vllm). Every request and abort is
written as a JSON line to ``INTEROP_VLLM_RECORD`` when that is set.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import time
from collections import Counter, OrderedDict
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import torch
from vllm.config import VllmConfig
from vllm.distributed.kv_events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    EventPublisherFactory,
    KVCacheEvent,
    KVEventBatch,
)
from vllm.v1.core.sched.utils import check_stop
from vllm.v1.engine import EngineCoreOutput, EngineCoreOutputs, EngineCoreRequest, FinishReason
from vllm.v1.engine.core_client import DPLBAsyncMPClient, EngineCoreClient
from vllm.v1.metrics.stats import PrefillStats, PrefixCacheStats, SchedulerStats
from vllm.v1.outputs import LogprobsLists, LogprobsTensors
from vllm.v1.request import Request

from tests.interop_sglang.standin import fake_model

NUM_BLOCKS = int(os.environ.get("INTEROP_VLLM_NUM_BLOCKS", "4096"))
STEP_S = float(os.environ.get("INTEROP_VLLM_STEP_MS", "2")) / 1000.0


class PrefixCache:
    """Full prompt blocks by chained hash, LRU-evicted at ``capacity`` blocks.

    A hit is counted in whole blocks and, as in vLLM's KV cache manager, never covers the
    last prompt token (that one must be computed to produce the first output)."""

    def __init__(self, block_size: int, capacity: int) -> None:
        self.block_size = block_size
        self.capacity = capacity
        self._blocks: OrderedDict[int, None] = OrderedDict()
        self.events: list[KVCacheEvent] = []  # since the last ``take_events``

    def _hashes(self, ids: list[int]) -> list[int]:
        out, parent = [], 0
        for start in range(0, len(ids) - len(ids) % self.block_size, self.block_size):
            parent = hash((parent, tuple(ids[start : start + self.block_size]))) & (2**63 - 1)
            out.append(parent)
        return out

    def take_events(self) -> list[KVCacheEvent]:
        events, self.events = self.events, []
        return events

    def lookup(self, prompt: list[int]) -> int:
        hit = 0
        for h in self._hashes(prompt):
            if h not in self._blocks:
                break
            self._blocks.move_to_end(h)
            hit += 1
        limit = (len(prompt) - 1) // self.block_size
        return min(hit, limit) * self.block_size

    def insert(self, ids: list[int]) -> None:
        parent: int | None = None
        for k, h in enumerate(self._hashes(ids)):
            if h not in self._blocks:
                tokens = ids[k * self.block_size : (k + 1) * self.block_size]
                self.events.append(
                    BlockStored(
                        block_hashes=[h],
                        parent_block_hash=parent,
                        token_ids=tokens,
                        block_size=self.block_size,
                        lora_id=None,
                        medium="GPU",
                        lora_name=None,
                    )
                )
            self._blocks[h] = None
            self._blocks.move_to_end(h)
            parent = h
        while len(self._blocks) > self.capacity:
            gone, _ = self._blocks.popitem(last=False)
            self.events.append(BlockRemoved(block_hashes=[gone], medium="GPU"))

    def clear(self) -> None:
        self._blocks.clear()
        self.events.append(AllBlocksCleared())

    @property
    def usage(self) -> float:
        return len(self._blocks) / self.capacity if self.capacity else 0.0


class _Engine:
    """One data-parallel rank's engine: its own prefix cache, queues, counters and KV-event
    publisher, as each engine process of a data-parallel vLLM has."""

    def __init__(self, rank: int, vllm_config: VllmConfig) -> None:
        self.rank = rank
        self.identity = rank.to_bytes(2, "little")  # an engine's identity, as vLLM's DP client keys it
        cache = vllm_config.cache_config
        self.max_model_len = vllm_config.model_config.max_model_len
        self.max_running = vllm_config.scheduler_config.max_num_seqs
        self.cache = PrefixCache(cache.block_size, NUM_BLOCKS)
        self.publisher = EventPublisherFactory.create(vllm_config.kv_events_config, rank)
        self.waiting: OrderedDict[str, Request] = OrderedDict()
        self.running: OrderedDict[str, Request] = OrderedDict()
        self.queries = self.hits = self.requests = 0

    @property
    def busy(self) -> bool:
        return bool(self.running or self.waiting)

    def publish(self) -> None:
        events = self.cache.take_events()
        if events:
            self.publisher.publish(
                KVEventBatch(ts=time.time(), events=events, data_parallel_rank=self.rank)
            )

    def stats(self) -> SchedulerStats:
        stats = SchedulerStats(
            num_running_reqs=len(self.running),
            num_waiting_reqs=len(self.waiting),
            kv_cache_usage=self.cache.usage,
        )
        stats.prefix_cache_stats = PrefixCacheStats(
            requests=self.requests, queries=self.queries, hits=self.hits
        )
        self.requests = self.queries = self.hits = 0
        return stats

    def step(self) -> tuple[list[EngineCoreOutput], set[str]]:
        """One step: the outputs, and the requests that finished in it."""
        out: list[EngineCoreOutput] = []
        finished: set[str] = set()
        admitted: dict[str, PrefillStats] = {}
        while self.waiting and len(self.running) < self.max_running:
            rid, req = self.waiting.popitem(last=False)
            prompt = list(req.prompt_token_ids or [])
            cached = self.cache.lookup(prompt)
            self.cache.insert(prompt)
            self.requests += 1
            self.queries += len(prompt)
            self.hits += cached
            stats = PrefillStats()
            stats.set(
                num_prompt_tokens=len(prompt),
                num_local_cached_tokens=cached,
                num_external_cached_tokens=0,
            )
            admitted[rid] = stats
            self.running[rid] = req
        for rid, req in list(self.running.items()):
            if req.pooling_params is not None:  # one step and done: the prompt's embedding
                out.append(_embedded(req, admitted.get(rid)))
                del self.running[rid]
                finished.add(rid)
                continue
            out.append(self._next(req, admitted.get(rid)))
            if rid in admitted and req.sampling_params is not None:
                out[-1].new_prompt_logprobs_tensors = _prompt_logprobs(
                    list(req.prompt_token_ids or []), req.sampling_params.prompt_logprobs
                )
            if req.is_finished():
                self.cache.insert(list(req.prompt_token_ids or []) + list(req.output_token_ids))
                del self.running[rid]
                finished.add(rid)
        return out, finished

    def _next(self, req: Request, prefill: PrefillStats | None) -> EngineCoreOutput:
        sp = req.sampling_params
        assert sp is not None
        position = req.num_output_tokens
        token = fake_model.next_token(sp.seed, position)
        req.append_output_token_ids(token)
        finished = check_stop(req, self.max_model_len)
        logprobs = None
        if sp.logprobs is not None:
            k = max(sp.logprobs, 0)
            vals, ids = fake_model.top_candidates(token, position, k) if k else ([], [])
            logprobs = LogprobsLists(
                logprob_token_ids=np.array([[token, *ids]], dtype=np.int32),
                logprobs=np.array(
                    [[fake_model.token_logprob(token, position), *vals]], dtype=np.float32
                ),
                sampled_token_ranks=np.array([1], dtype=np.int32),
            )
        return EngineCoreOutput(
            request_id=req.request_id,
            new_token_ids=[token],
            new_logprobs=logprobs,
            finish_reason=req.get_finished_reason() if finished else None,
            stop_reason=req.stop_reason if finished else None,
            prefill_stats=prefill,
        )


class StandinCore(EngineCoreClient):
    """The async engine-core client AsyncLLM uses, answering from the stand-in model.

    With ``--data-parallel-size`` N > 1 it stands in for vLLM's load-balancing DP client
    (``DPLBAsyncMPClient``) over N engines: a request goes to the engine that client's own
    ``get_core_engine_for_request`` picks (the rank the request names, else the least
    loaded by the counts its coordinator would publish), each engine's outputs and
    ``SchedulerStats`` come under its ``engine_index``, and the client's in-flight table
    (``reqs_in_flight``, which the gRPC servicer reads for a request's rank) is kept by
    that client's own ``process_engine_outputs``."""

    def __init__(self, vllm_config: VllmConfig, *_: Any, **__: Any) -> None:
        self.vllm_config = vllm_config
        # What the real engine reports after profiling memory: vLLM's frontend puts it in
        # the config, and /metrics' vllm:cache_config_info reads it from there.
        vllm_config.cache_config.num_gpu_blocks = NUM_BLOCKS
        events = vllm_config.kv_events_config
        self._kv_events = events if events is not None and events.enable_kv_cache_events else None
        size = max(1, vllm_config.parallel_config.data_parallel_size)
        self.engines = [_Engine(rank, vllm_config) for rank in range(size)]
        self.engine_ranks_managed = list(range(size))
        self.engine_status = {"status": "healthy"}
        self.resources = SimpleNamespace(engine_dead=False)
        # The state vLLM's DPLBAsyncMPClient keeps, read and written by its own methods.
        self.client_count = 1
        self.eng_start_index = 0
        self.core_engines = [e.identity for e in self.engines]
        self.lb_engines: list[list[int | float]] = [[0, 0, 0.0] for _ in self.engines]
        self.reqs_in_flight: dict[str, bytes] = {}
        self.engine_inflight: Counter[bytes] = Counter()
        self.streaming_reqs: set[str] = set()
        self._outputs: asyncio.Queue[EngineCoreOutputs] | None = None
        self._wake: asyncio.Event | None = None
        self._loop_task: asyncio.Task[None] | None = None
        record = os.environ.get("INTEROP_VLLM_RECORD")
        self._record_path = Path(record) if record else None

    # --- what AsyncLLM calls ---------------------------------------------------------

    def _start(self) -> None:
        if self._loop_task is None:
            self._outputs = asyncio.Queue()
            self._wake = asyncio.Event()
            self._loop_task = asyncio.get_running_loop().create_task(self._step_loop())

    async def get_output_async(self) -> EngineCoreOutputs:
        self._start()
        assert self._outputs is not None
        outputs = await self._outputs.get()
        if len(self.engines) > 1:
            await DPLBAsyncMPClient.process_engine_outputs(self, outputs)  # type: ignore[arg-type]
        return outputs

    def _engine_for(self, request: EngineCoreRequest) -> _Engine:
        if len(self.engines) == 1:
            return self.engines[0]
        identity = DPLBAsyncMPClient.get_core_engine_for_request(self, request)  # type: ignore[arg-type]
        return self.engines[self.core_engines.index(identity)]

    async def add_request_async(self, request: EngineCoreRequest) -> None:
        self._start()
        engine = self._engine_for(request)
        kind = "embed" if request.pooling_params is not None else "generate"
        self._write({"kind": kind, "engine": engine.rank, **_describe(request)})
        engine.waiting[request.request_id] = Request.from_engine_core_request(
            request, block_hasher=None
        )
        assert self._wake is not None
        self._wake.set()

    async def abort_requests_async(self, request_ids: list[str]) -> None:
        self._write({"kind": "abort", "rid": ",".join(request_ids), "rids": list(request_ids)})
        for rid in request_ids:
            for engine in self.engines:
                engine.waiting.pop(rid, None)
                engine.running.pop(rid, None)
            if (identity := self.reqs_in_flight.pop(rid, None)) is not None:
                self.engine_inflight[identity] -= 1

    async def get_supported_tasks_async(self) -> tuple[Any, ...]:
        # A pooling runner (``--runner pooling``) serves embeddings; the generate runner, text.
        return ("embed",) if self.vllm_config.model_config.runner_type == "pooling" else ("generate",)

    async def reset_mm_cache_async(self) -> None:
        return None

    async def reset_encoder_cache_async(self) -> None:
        return None

    async def reset_prefix_cache_async(
        self, reset_running_requests: bool = False, reset_connector: bool = False
    ) -> bool:
        self._write({"kind": "flush", "rid": "flush"})
        for engine in self.engines:
            engine.cache.clear()
            engine.publish()
        return True

    async def is_scheduler_paused_async(self) -> bool:
        return False

    async def is_sleeping_async(self) -> bool:
        return False

    def dp_engines_running(self) -> bool:
        return any(e.busy for e in self.engines)

    def get_kv_event_sources(self) -> dict[int, Any]:
        if self._kv_events is None:
            return {}
        return {e.rank: self._kv_events for e in self.engines}

    def shutdown(self, timeout: float | None = None) -> None:
        if self._loop_task is not None:
            self._loop_task.cancel()
        for engine in self.engines:
            engine.publisher.shutdown()

    # --- the step loop ----------------------------------------------------------------

    async def _step_loop(self) -> None:
        assert self._outputs is not None and self._wake is not None
        while True:
            if not self.dp_engines_running():
                self._wake.clear()
                await self._wake.wait()
            await asyncio.sleep(STEP_S)
            for engine in self.engines:
                if not engine.busy:
                    continue
                outputs, finished = engine.step()
                engine.publish()
                self._put(engine, outputs, finished)
                if not engine.busy:
                    # An idle step, so the gauges read zero once the last request is done.
                    self._put(engine, [], set())
            # What vLLM's DP coordinator publishes to the client: each engine's queues.
            self.lb_engines = [
                [len(e.waiting), len(e.running), e.cache.usage] for e in self.engines
            ]

    def _put(self, engine: _Engine, outputs: list[EngineCoreOutput], finished: set[str]) -> None:
        assert self._outputs is not None
        self._outputs.put_nowait(
            EngineCoreOutputs(
                engine_index=engine.rank,
                outputs=outputs,
                scheduler_stats=engine.stats(),
                timestamp=time.monotonic(),
                finished_requests=finished or None,
            )
        )

    def _write(self, record: dict[str, Any]) -> None:
        if self._record_path is None:
            return
        with self._record_path.open("a") as f:
            f.write(json.dumps(record) + "\n")


EMBED_DIM = 32


def _embedding(prompt: list[int]) -> torch.Tensor:
    """A unit vector that depends on each prompt id and its position: deterministic, so
    the same ids give the same embedding on every path, and different ids a different one."""
    ids = np.asarray(prompt, dtype=np.int64)
    vec = np.zeros(EMBED_DIM, dtype=np.float64)
    np.add.at(vec, (ids * 31 + np.arange(len(ids))) % EMBED_DIM, 1.0 + (ids % 7) / 7.0)
    norm = float(np.linalg.norm(vec)) or 1.0
    return torch.from_numpy((vec / norm).astype(np.float32))


def _embedded(req: Request, prefill: PrefillStats | None) -> EngineCoreOutput:
    """A pooling request's one output, as the model runner's pooler hands it on."""
    return EngineCoreOutput(
        request_id=req.request_id,
        new_token_ids=[],
        pooling_output=_embedding(list(req.prompt_token_ids or [])),
        finish_reason=FinishReason.STOP,
        prefill_stats=prefill,
    )


def _prompt_logprobs(prompt: list[int], k: int | None) -> LogprobsTensors | None:
    """Prompt logprobs as the model runner hands them on: one row per prompt position after
    the first, the prompt's own id then ``k`` candidates (``fake_model``'s rule)."""
    if k is None or len(prompt) < 2:
        return None
    k = max(k, 0)
    ids, vals = [], []
    for pos in range(1, len(prompt)):
        token = prompt[pos]
        top_vals, top_ids = fake_model.top_candidates(token, pos, k) if k else ([], [])
        ids.append([token, *top_ids])
        vals.append([fake_model.token_logprob(token, pos), *top_vals])
    return LogprobsTensors(
        logprob_token_ids=torch.tensor(ids, dtype=torch.int32),
        logprobs=torch.tensor(vals, dtype=torch.float32),
        selected_token_ranks=torch.ones(len(ids), dtype=torch.int32),
    )


def _describe(request: EngineCoreRequest) -> dict[str, Any]:
    """What the engine core received, as JSON: the fields a gateway can influence."""
    sp = request.sampling_params
    fields = (
        "n",
        "temperature",
        "top_p",
        "top_k",
        "min_p",
        "seed",
        "max_tokens",
        "min_tokens",
        "stop_token_ids",
        "ignore_eos",
        "logprobs",
        "prompt_logprobs",
        "presence_penalty",
        "frequency_penalty",
        "repetition_penalty",
        "skip_special_tokens",
        "spaces_between_special_tokens",
        "stop",
        "include_stop_str_in_output",
        "logit_bias",
        "allowed_token_ids",
        "bad_words",
        "structured_outputs",
        "output_kind",
    )
    sampling = {f: _plain(getattr(sp, f, None)) for f in fields} if sp is not None else {}
    return {
        "rid": request.request_id,
        "external_req_id": request.external_req_id,
        "prompt_token_ids": list(request.prompt_token_ids or []),
        "sampling": sampling,
        "data_parallel_rank": request.data_parallel_rank,
        "priority": request.priority,
    }


def _plain(value: Any) -> Any:
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple, set)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if dataclasses.is_dataclass(value):  # structured outputs: the constraint as the client named it
        return {
            f.name: _plain(getattr(value, f.name))
            for f in dataclasses.fields(value)
            if not f.name.startswith("_") and getattr(value, f.name) not in (None, False)
        }
    return str(value)
