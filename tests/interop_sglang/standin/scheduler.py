"""A stand-in for SGLang's per-rank scheduler process, for a machine with no GPU.

SGLang's launcher spawns one scheduler process per rank and talks to it over
ZMQ with pickled ``io_struct`` objects. This process takes its place on the
same sockets: it receives ``TokenizedGenerateReqInput`` / ``AbortReq`` /
``FlushCacheReqInput``, and answers with ``BatchTokenIDOutput`` on the
detokenizer socket, exactly as the real one. Everything that runs on a CPU is
SGLang's own code: ``Req`` (finish rules: stop ids, eos, stop strings,
length, abort), ``validate_input_length``, the abort rule (waiting requests
are answered with an ``AbortReq``, running ones get ``to_finish``) and
``SchedulerOutputStreamer`` (which builds every ``BatchTokenIDOutput``). Only
the forward pass is ours: ``fake_model`` picks the next token from the
request's seed and position.

When the server runs with ``--kv-events-config``, the prompt pages each admitted request
brings are published as stored blocks, and a flush as a clear, through SGLang's own
``EventPublisherFactory`` and ``ZmqEventPublisher`` (as its radix cache's inserts and resets
are, page by page, each page's hash chained on its parent's); no page is ever evicted.

Every request received is appended, as one JSON line, to the file named by
``INTEROP_SGLANG_RECORD``: the interop tests and the corpus compare what the
scheduler receives through the gateway with what SGLang's own HTTP server
sends it.

Runs only inside the interop virtualenv (it imports sglang).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import signal
import threading
import time
from array import array
from typing import Any

import zmq
from sglang.srt.disaggregation.kv_events import (
    AllBlocksCleared,
    BlockStored,
    EventPublisherFactory,
    KVEventBatch,
)
from sglang.srt.disaggregation.utils import DisaggregationMode
from sglang.srt.managers.io_struct import (
    AbortReq,
    BatchTokenizedGenerateReqInput,
    FlushCacheReqInput,
    FlushCacheReqOutput,
    GetInternalStateReq,
    GetInternalStateReqOutput,
    TokenizedGenerateReqInput,
)
from sglang.srt.managers.schedule_batch import FINISH_ABORT, Req
from sglang.srt.managers.scheduler_components.ipc_channels import SchedulerIpcChannels
from sglang.srt.managers.scheduler_components.output_streamer import SchedulerOutputStreamer
from sglang.srt.managers.utils import validate_input_length
from sglang.srt.runtime_context import SpawnRanks, get_serving, publish, spawn_world_rank
from sglang.srt.speculative.spec_info import SpeculativeAlgorithm
from sglang.srt.utils.hf_transformers.tokenizer import get_tokenizer

from tests.interop_sglang.standin import fake_model

logger = logging.getLogger("interop.standin")

RECORD_ENV = "INTEROP_SGLANG_RECORD"
STEP_ENV = "INTEROP_SGLANG_STEP_MS"
KV_TOKENS_ENV = "INTEROP_SGLANG_KV_TOKENS"
DEFAULT_KV_TOKENS = 65536  # the KV pool a mid-size GPU would give this model


class _NullPrefixCache:
    """The streamer asks the prefix cache only for a storage backend name."""

    cache_controller = None


def _jsonable(value: Any) -> Any:
    if isinstance(value, (set, frozenset)):
        return sorted(value)
    if isinstance(value, array):
        return list(value)
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    return repr(value)


def record_of(req: TokenizedGenerateReqInput) -> dict[str, Any]:
    """What the scheduler was asked to do, as plain JSON."""
    sp = req.sampling_params
    params = {f: _jsonable(getattr(sp, f)) for f in sp.__struct_fields__}
    return {
        "kind": "generate",
        "rid": req.rid,
        "input_ids": list(req.input_ids or []),
        "sampling_params": params,
        "return_logprob": req.return_logprob,
        "logprob_start_len": req.logprob_start_len,
        "top_logprobs_num": req.top_logprobs_num,
        "token_ids_logprob": _jsonable(req.token_ids_logprob),
        "stream": req.stream,
        "lora_id": req.lora_id,
        "require_reasoning": req.require_reasoning,
        "routing_key": req.routing_key,
        "priority": req.priority,
        "time": time.time(),
    }


def _page_hash(parent: int | None, page: list[int]) -> int:
    """A page's block hash: its ids chained on its parent's hash, as a signed 64-bit int."""
    digest = hashlib.blake2b(repr((parent, page)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big", signed=True)


class _PublishedPages:
    """The prompt pages the stand-in holds, told to SGLang's own KV-event publisher."""

    def __init__(self, server_args: Any) -> None:
        config = getattr(server_args, "kv_events_config", None)
        self.publisher = EventPublisherFactory.create(config, 0) if config else None
        self.page = max(1, int(getattr(server_args, "page_size", None) or 1))
        self.held: set[int] = set()

    def stored(self, ids: list[int]) -> None:
        """Publish the whole pages of ``ids`` not held yet (always a suffix: nothing is evicted)."""
        if self.publisher is None:
            return
        parent: int | None = None
        first_parent: int | None = None
        hashes: list[int] = []
        tokens: list[int] = []
        for start in range(0, len(ids) - len(ids) % self.page, self.page):
            page = ids[start : start + self.page]
            h = _page_hash(parent, page)
            if h not in self.held:
                if not hashes:
                    first_parent = parent
                self.held.add(h)
                hashes.append(h)
                tokens.extend(page)
            parent = h
        if hashes:
            event = BlockStored(block_hashes=hashes, parent_block_hash=first_parent, token_ids=tokens,
                                block_size=self.page, lora_id=None)
            self.publisher.publish(KVEventBatch(ts=time.time(), events=[event]))

    def cleared(self) -> None:
        if self.publisher is not None:
            self.held.clear()
            self.publisher.publish(KVEventBatch(ts=time.time(), events=[AllBlocksCleared()]))


class StandinScheduler:
    """One rank: the receive loop, the step loop and the streamer."""

    def __init__(self, server_args: Any, port_args: Any) -> None:
        self.server_args = server_args
        self.channels = SchedulerIpcChannels.create(
            port_args=port_args,
            is_rank_zero=True,
            skip_tokenizer_init=bool(server_args.skip_tokenizer_init),
            metrics_enabled=False,
            enable_scripted_runtime=False,
        )
        self.tokenizer = None
        if not server_args.skip_tokenizer_init:
            self.tokenizer = get_tokenizer(
                server_args.tokenizer_path or server_args.model_path,
                trust_remote_code=bool(server_args.trust_remote_code),
            )
        with open(os.path.join(server_args.model_path, "config.json")) as f:
            hf_config = json.load(f)
        self.vocab_size = int(hf_config["vocab_size"])
        eos = hf_config.get("eos_token_id")
        self.eos_token_ids = set(eos if isinstance(eos, list) else [eos] if eos is not None else [])
        context_len = int(server_args.context_length or hf_config["max_position_embeddings"])
        self.max_total_num_tokens = int(os.environ.get(KV_TOKENS_ENV, DEFAULT_KV_TOKENS))
        # tp_worker's rule: one slot for the last token, five reserved.
        self.max_req_len = min(context_len - 1, self.max_total_num_tokens - 1)
        self.max_req_input_len = self.max_req_len - 5
        self.step_s = float(os.environ.get(STEP_ENV, "2")) / 1000.0
        self.record_path = os.environ.get(RECORD_ENV)
        self.record_lock = threading.Lock()
        self.streamer = SchedulerOutputStreamer(
            send_to_detokenizer=self.channels.send_to_detokenizer,
            tree_cache=_NullPrefixCache(),  # type: ignore[arg-type]
            server_args=server_args,
            is_generation=True,
            spec_algorithm=SpeculativeAlgorithm.NONE,
            disaggregation_mode=DisaggregationMode.NULL,
            enable_hicache_storage=lambda: False,
        )
        self.waiting: list[Req] = []
        self.running: list[Req] = []
        self.pages = _PublishedPages(server_args)
        self.started = time.perf_counter()

    def init_info(self) -> dict[str, Any]:
        return {
            "status": "ready",
            "max_total_num_tokens": self.max_total_num_tokens,
            "max_req_input_len": self.max_req_input_len,
            # The phases a GPU rank reports; none of them runs here.
            "startup_time": {"load_weight": 0.0, "kv_cache_allocation": 0.0,
                             "scheduler_e2e": time.perf_counter() - self.started},
        }

    # --- receiving -------------------------------------------------------

    def _record(self, recv: TokenizedGenerateReqInput) -> None:
        self._write(record_of(recv))

    def _write(self, record: dict[str, Any]) -> None:
        if not self.record_path:
            return
        line = json.dumps(record) + "\n"
        with self.record_lock, open(self.record_path, "a") as f:
            f.write(line)

    def handle_generate(self, recv: TokenizedGenerateReqInput) -> None:
        self._record(recv)
        req = Req(
            recv.rid,
            recv.input_text,
            recv.input_ids,
            recv.sampling_params,
            return_logprob=recv.return_logprob,
            top_logprobs_num=recv.top_logprobs_num,
            token_ids_logprob=recv.token_ids_logprob,
            stream=recv.stream,
            lora_id=recv.lora_id,
            eos_token_ids=self.eos_token_ids,
            vocab_size=self.vocab_size,
            require_reasoning=recv.require_reasoning,
            http_worker_ipc=recv.http_worker_ipc,
            time_stats=recv.time_stats,
        )
        req.tokenizer = self.tokenizer
        self._init_max_new_tokens(req)
        error = validate_input_length(req, self.max_req_input_len, get_serving().allow_auto_truncate)
        if error:
            req.set_finish_with_abort(error)
        req.logprob_start_len = recv.logprob_start_len if recv.return_logprob else -1
        self.waiting.append(req)

    def _init_max_new_tokens(self, req: Req) -> None:
        """The scheduler's cap: what the request asked, within the context left."""
        asked = req.sampling_params.max_new_tokens
        wanted = asked if asked is not None else 1 << 30
        room = self.max_req_len - len(req.origin_input_ids) - 1
        req.sampling_params.max_new_tokens = max(0, min(wanted, room))

    def handle_abort(self, recv: AbortReq) -> None:
        """SGLang's rule: a queued request is answered at once, a running one finishes next step."""
        self._write({"kind": "abort", "rid": recv.rid, "abort_all": recv.abort_all, "time": time.time()})
        def hit(req: Req) -> bool:
            return recv.abort_all or req.rid.startswith(recv.rid or "\0")

        for req in [r for r in self.waiting if hit(r)]:
            self.waiting.remove(req)
            self.channels.send_to_tokenizer.send_output(
                AbortReq(rid=req.rid, finished_reason=recv.finished_reason), req
            )
        for req in self.running:
            if not req.finished() and hit(req):
                req.to_finish = (
                    FINISH_ABORT(recv.abort_message, 503) if recv.abort_message else FINISH_ABORT()
                )

    def dispatch(self, obj: Any) -> None:
        if isinstance(obj, TokenizedGenerateReqInput):
            self.handle_generate(obj)
        elif isinstance(obj, BatchTokenizedGenerateReqInput):
            for one in obj.batch:
                self.handle_generate(one)
        elif isinstance(obj, AbortReq):
            self.handle_abort(obj)
        elif isinstance(obj, FlushCacheReqInput):
            self.pages.cleared()
            self.channels.send_to_tokenizer.send_output(FlushCacheReqOutput(success=True), obj)
        elif isinstance(obj, GetInternalStateReq):  # the HTTP server's /get_server_info waits for it
            state = {"max_total_num_tokens": self.max_total_num_tokens, "last_gen_throughput": 0.0}
            self.channels.send_to_tokenizer.send_output(GetInternalStateReqOutput(internal_state=state), obj)
        else:
            logger.info("stand-in scheduler ignores %s", type(obj).__name__)

    # --- the forward pass ------------------------------------------------

    def _prefill_logprobs(self, req: Req) -> None:
        if not req.return_logprob:
            return
        ids = list(req.origin_input_ids)
        start = max(req.logprob_start_len, 0)
        vals: list[float | None] = []
        for pos in range(start, len(ids)):
            vals.append(None if pos == 0 else fake_model.token_logprob(ids[pos], pos))
        lp = req.logprob
        lp.input_token_logprobs_val = vals
        lp.input_token_logprobs_idx = ids[start:]
        k = req.logprob.top_logprobs_num
        lp.input_top_logprobs_val = []
        lp.input_top_logprobs_idx = []
        for pos in range(start, len(ids)):
            if k > 0 and pos > 0:
                v, i = fake_model.top_candidates(ids[pos], pos, k)
            else:
                v, i = [], []
            lp.input_top_logprobs_val.append(v)
            lp.input_top_logprobs_idx.append(i)
        lp.input_token_ids_logprobs_val = []
        lp.input_token_ids_logprobs_idx = []
        for _ in range(start, len(ids)):
            wanted = list(req.logprob.token_ids_logprob or [])
            lp.input_token_ids_logprobs_val.append([fake_model.token_logprob(t, 0) for t in wanted])
            lp.input_token_ids_logprobs_idx.append(wanted)

    def _decode_one(self, req: Req) -> None:
        pos = len(req.output_ids)
        token = fake_model.next_token(req.sampling_params.sampling_seed, pos)
        req.output_ids.append(token)
        if req.return_logprob:
            lp = req.logprob
            for name in ("output_token_logprobs_val", "output_token_logprobs_idx",
                         "output_top_logprobs_val", "output_top_logprobs_idx",
                         "output_token_ids_logprobs_val", "output_token_ids_logprobs_idx"):
                if getattr(lp, name) is None:
                    setattr(lp, name, [])
            lp.output_token_logprobs_val.append(fake_model.token_logprob(token, pos))
            lp.output_token_logprobs_idx.append(token)
            k = req.logprob.top_logprobs_num
            v, i = fake_model.top_candidates(token, pos, k) if k > 0 else ([], [])
            lp.output_top_logprobs_val.append(v)
            lp.output_top_logprobs_idx.append(i)
            wanted = list(lp.token_ids_logprob or [])
            lp.output_token_ids_logprobs_val.append([fake_model.token_logprob(t, pos) for t in wanted])
            lp.output_token_ids_logprobs_idx.append(wanted)
        req.update_finish_state(1)

    def step(self) -> None:
        admitted, self.waiting = self.waiting, []
        for req in admitted:
            if req.to_finish is None:
                self._prefill_logprobs(req)
                self.pages.stored(list(req.origin_input_ids))
            self.running.append(req)
        batch = [r for r in self.running if not r.finished()]
        for req in batch:
            # As on a GPU, a request marked to finish (aborted, refused at
            # admission) still runs one forward pass; its finish rule then ends it.
            try:
                self._decode_one(req)
            except Exception as exc:  # one bad request must not end the rank
                logger.exception("stand-in step failed for %s", req.rid)
                req.finished_reason = FINISH_ABORT(f"stand-in scheduler: {exc!r}", 500)
        if batch:
            self.streamer.stream_output(batch, any(r.return_logprob for r in batch))
        self.running = [r for r in self.running if not r.finished()]

    # --- the loop ----------------------------------------------------------

    def run(self) -> None:
        sock = self.channels.recv_from_tokenizer
        poller = zmq.Poller()
        poller.register(sock, zmq.POLLIN)
        while True:
            busy = bool(self.running or self.waiting)
            events = dict(poller.poll(0 if busy else 50))
            while sock in events:
                obj = sock.recv_pyobj()
                try:
                    self.dispatch(obj)
                except Exception:
                    logger.exception("stand-in scheduler could not take %s", type(obj).__name__)
                events = dict(poller.poll(0))
            if self.running or self.waiting:
                self.step()
                if self.step_s > 0:
                    time.sleep(self.step_s)


def run_standin_scheduler(
    server_args: Any,
    port_args: Any,
    gpu_id: int,
    tp_rank: int,
    pp_rank: int,
    dp_rank: int | None,
    pipe_writer: Any,
    *_display_ranks: Any,
) -> None:
    """The process target SGLang's launcher calls in place of ``run_scheduler_process``."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    logging.basicConfig(level=logging.INFO, format="[standin] %(message)s")
    publish(
        server_args,
        role="scheduler",
        ranks=SpawnRanks(
            world_rank=spawn_world_rank(server_args, tp_rank=tp_rank, pp_rank=pp_rank),
            dp_rank=dp_rank,
            gpu_id=gpu_id,
        ),
    )
    try:
        scheduler = StandinScheduler(server_args, port_args)
    except Exception as exc:  # the launcher turns this into a named start failure
        pipe_writer.send({"status": "error", "error": f"stand-in scheduler: {exc!r}"})
        raise
    pipe_writer.send(scheduler.init_info())
    scheduler.run()


__all__ = ["StandinScheduler", "record_of", "run_standin_scheduler"]
