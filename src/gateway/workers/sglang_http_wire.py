"""SGLang's native HTTP API in the worker seam's terms: no I/O, only translation.

The pipeline speaks ``pb.GenerateRequest`` / ``pb.GenerateResponse`` to every worker.
SGLang's HTTP server takes the same request as JSON on ``/generate`` (``input_ids``,
``sampling_params``, ``stream``, ``rid``, ...) and answers with dicts of
``output_ids`` plus ``meta_info`` (``finish_reason``, ``prompt_tokens``,
``completion_tokens``, ``cached_tokens``, logprob lists). Keeping the translation
here, apart from the client, lets it be tested without a socket and keeps the shapes
in one place.

Streamed answers carry the output so far (or, with ``--incremental-streaming-output``,
only the new part); both are read the same way: ``completion_tokens`` is cumulative,
so the new tokens are the last ``completion_tokens - already_sent`` ids of the list.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import orjson
from google.protobuf.json_format import MessageToDict

from gateway.proto import sglang_scheduler_pb2 as pb

# proto3 cannot tell unset from zero: the same defaults SGLang's gRPC servicer applies.
_UNSET_MEANS = {"top_p": 1.0, "top_k": -1, "repetition_penalty": 1.0}


def sampling_params_json(sp: pb.SamplingParams) -> dict[str, Any]:
    """``SamplingParams`` as SGLang's ``sampling_params`` object (only what is set)."""
    out: dict[str, Any] = {
        "temperature": sp.temperature,
        "top_p": sp.top_p or _UNSET_MEANS["top_p"],
        "top_k": sp.top_k or _UNSET_MEANS["top_k"],
        "min_p": sp.min_p,
        "frequency_penalty": sp.frequency_penalty,
        "presence_penalty": sp.presence_penalty,
        "repetition_penalty": sp.repetition_penalty or _UNSET_MEANS["repetition_penalty"],
        "n": max(1, sp.n),
        "skip_special_tokens": sp.skip_special_tokens,
        "spaces_between_special_tokens": sp.spaces_between_special_tokens,
        "ignore_eos": sp.ignore_eos,
        "no_stop_trim": sp.no_stop_trim,
    }
    if sp.HasField("max_new_tokens"):
        out["max_new_tokens"] = sp.max_new_tokens
    if sp.min_new_tokens:
        out["min_new_tokens"] = sp.min_new_tokens
    if sp.HasField("stream_interval"):
        out["stream_interval"] = sp.stream_interval
    if sp.stop:
        out["stop"] = list(sp.stop)
    if sp.stop_token_ids:
        out["stop_token_ids"] = list(sp.stop_token_ids)
    constraint = sp.WhichOneof("constraint")
    if constraint is not None:
        out[constraint] = getattr(sp, constraint)
    if sp.logit_bias:
        out["logit_bias"] = dict(sp.logit_bias)
    if sp.HasField("custom_params"):
        custom = MessageToDict(sp.custom_params)
        custom.pop("seed", None)  # see ``without_seed``
        if custom:
            out["custom_params"] = custom
    return out


def without_seed(request: pb.GenerateRequest) -> pb.GenerateRequest:
    """``request`` without ``custom_params.seed``, for an SGLang worker.

    The gateway carries a client's seed there for the engines whose wire has a seed field
    (vLLM, TensorRT-LLM); SGLang reads ``custom_params`` only in custom logit processors,
    so the seed would reach no sampler. A copy, made only when there is a seed to drop:
    the same request may be retried on a worker of another engine."""
    sp = request.sampling_params
    if not sp.HasField("custom_params") or "seed" not in sp.custom_params.fields:
        return request
    out = pb.GenerateRequest()
    out.CopyFrom(request)
    del out.sampling_params.custom_params.fields["seed"]
    if not out.sampling_params.custom_params.fields:
        out.sampling_params.ClearField("custom_params")
    return out


def prompt_ids(request: pb.GenerateRequest) -> np.ndarray[Any, np.dtype[np.uint32]]:
    """The prompt's ids as an array for ``orjson`` (``OPT_SERIALIZE_NUMPY``): copying the
    repeated field into a list makes a Python int per id and costs several times what
    writing the JSON does; the array is filled from it in C."""
    return np.array(request.tokenized.input_ids, dtype=np.uint32)


def body_json(body: dict[str, Any]) -> bytes:
    """A request body with its prompt ids as an array (``prompt_ids``), as JSON."""
    return orjson.dumps(body, option=orjson.OPT_SERIALIZE_NUMPY)


def generate_body(request: pb.GenerateRequest) -> dict[str, Any]:
    """The JSON body of ``POST /generate`` for one tokenized request (``body_json`` writes it)."""
    body: dict[str, Any] = {
        "rid": request.request_id,
        "input_ids": prompt_ids(request),
        "sampling_params": sampling_params_json(request.sampling_params),
        "stream": request.stream,
    }
    if request.return_logprob:
        body["return_logprob"] = True
        body["logprob_start_len"] = request.logprob_start_len
        body["top_logprobs_num"] = request.top_logprobs_num
        if request.token_ids_logprob:
            body["token_ids_logprob"] = list(request.token_ids_logprob)
    if request.HasField("data_parallel_rank"):
        body["data_parallel_rank"] = request.data_parallel_rank
    if request.lora_id:
        body["lora_path"] = request.lora_id
    if request.return_hidden_states:
        body["return_hidden_states"] = True
    if request.custom_logit_processor:
        body["custom_logit_processor"] = request.custom_logit_processor
    if request.HasField("disaggregated_params") and request.disaggregated_params.bootstrap_host:
        pd = request.disaggregated_params
        body["bootstrap_host"] = pd.bootstrap_host
        body["bootstrap_port"] = pd.bootstrap_port
        body["bootstrap_room"] = pd.bootstrap_room
    return body


class AnswerError(ValueError):
    """The worker's answer is not the shape SGLang's HTTP server sends."""


def _ints(value: object, what: str) -> list[int]:
    if not isinstance(value, list):
        raise AnswerError(f"{what} must be a list of token ids")
    for v in value:  # a loop, not all() over a generator: a streamed event's new ids are one or two
        if not isinstance(v, int):
            raise AnswerError(f"{what} must be a list of token ids")
    return value


def _count(meta: dict[str, Any], key: str) -> int:
    value = meta.get(key, 0)
    if value is None:
        return 0
    if not isinstance(value, int) or value < 0:
        raise AnswerError(f"meta_info.{key} must be a count, got {value!r}")
    return value


def _finish(meta: dict[str, Any]) -> tuple[str, int | str | None] | None:
    """``(type, matched)`` of ``meta_info.finish_reason``, or None while running."""
    reason = meta.get("finish_reason")
    if reason is None:
        return None
    if isinstance(reason, str):  # some versions send the bare type
        return reason, None
    if not isinstance(reason, dict) or not isinstance(reason.get("type"), str):
        raise AnswerError(f"meta_info.finish_reason has an unknown shape: {reason!r}")
    matched = reason.get("matched")
    if matched is not None and not isinstance(matched, (int, str)):
        matched = None
    return reason["type"], matched


def _output_logprobs(meta: dict[str, Any], count: int) -> pb.OutputLogProbs | None:
    """The logprobs of the last ``count`` output tokens (lists of [logprob, id, text])."""
    rows = meta.get("output_token_logprobs")
    if not isinstance(rows, list) or count <= 0:
        return None
    rows = rows[-count:]
    out = pb.OutputLogProbs(
        token_logprobs=[float(r[0]) for r in rows],
        token_ids=[int(r[1]) for r in rows],
    )
    tops = meta.get("output_top_logprobs")
    if isinstance(tops, list) and tops:
        for top in tops[-count:]:
            entries = top or []
            out.top_logprobs.add(
                values=[float(e[0]) for e in entries], token_ids=[int(e[1]) for e in entries]
            )
    return out


def _input_logprobs(meta: dict[str, Any]) -> pb.InputLogProbs | None:
    rows = meta.get("input_token_logprobs")
    if not isinstance(rows, list) or not rows:
        return None
    out = pb.InputLogProbs()
    for row in rows:
        value = out.token_logprobs.add()
        if row[0] is not None:
            value.value = float(row[0])
        out.token_ids.append(int(row[1]))
    tops = meta.get("input_top_logprobs")
    if isinstance(tops, list):
        for top in tops:
            entries = top or []
            out.top_logprobs.add(
                values=[float(e[0]) for e in entries if e[0] is not None],
                token_ids=[int(e[1]) for e in entries if e[0] is not None],
            )
    return out


def _complete(
    request_id: str, index: int, ids: Sequence[int], meta: dict[str, Any],
    finish: tuple[str, int | str | None], logprobs: pb.OutputLogProbs | None,
    input_logprobs: pb.InputLogProbs | None,
) -> pb.GenerateResponse:
    reason, matched = finish
    complete = pb.GenerateComplete(
        output_ids=list(ids),
        finish_reason=reason,
        prompt_tokens=_count(meta, "prompt_tokens"),
        completion_tokens=_count(meta, "completion_tokens"),
        cached_tokens=_count(meta, "cached_tokens"),
        index=index,
    )
    if isinstance(matched, int) and not isinstance(matched, bool) and matched >= 0:
        complete.matched_token_id = matched
    elif isinstance(matched, str):
        complete.matched_stop_str = matched
    if logprobs is not None:
        complete.output_logprobs.CopyFrom(logprobs)
    if input_logprobs is not None:
        complete.input_logprobs.CopyFrom(input_logprobs)
    return pb.GenerateResponse(request_id=request_id, complete=complete)


def _parts(answer: object, *, check_ids: bool = True) -> tuple[list[int], dict[str, Any], int]:
    """``(output_ids, meta_info, index)``; ``check_ids=False`` checks only that the ids are a list."""
    if not isinstance(answer, dict):
        raise AnswerError("each answer must be a JSON object")
    meta = answer.get("meta_info")
    if not isinstance(meta, dict):
        raise AnswerError("the answer has no meta_info object")
    index = answer.get("index", 0)
    if not isinstance(index, int) or index < 0:
        raise AnswerError(f"index must be a non-negative integer, got {index!r}")
    ids = answer.get("output_ids")
    if check_ids:
        return _ints(ids, "output_ids"), meta, index
    if not isinstance(ids, list):
        raise AnswerError("output_ids must be a list of token ids")
    return ids, meta, index


def whole_answer(request_id: str, answer: object) -> list[pb.GenerateResponse]:
    """A non-streamed answer (one object, or a list of them when n > 1) as completes."""
    items = answer if isinstance(answer, list) else [answer]
    out: list[pb.GenerateResponse] = []
    for position, item in enumerate(items):
        ids, meta, index = _parts(item)
        if "index" not in item:
            index = position  # a batch answer lists its samples in order
        finish = _finish(meta) or ("stop", None)
        out.append(_complete(
            request_id, index, ids, meta, finish, _output_logprobs(meta, len(ids)), _input_logprobs(meta)
        ))
    return out


class StreamReader:
    """Turns one streamed ``/generate`` answer (SSE ``data:`` objects) into the chunks and
    completes a gRPC worker would send: each chunk carries only its new tokens, and a
    finished sample sends its last chunk and then a complete repeating those tokens.

    Once per streamed token, so the common event (one sample, no logprobs) is read with as
    few calls and look-ups as its checks allow: a list, not a generator, of what it gives;
    the counts read in place; and no logprob look-ups at all when the request asked for none
    (``logprobs`` False: whatever the worker sends then is not the client's)."""

    __slots__ = ("_input_sent", "_logprobs", "_request_id", "_sent")

    def __init__(self, request_id: str, logprobs: bool = True) -> None:
        self._request_id = request_id
        self._logprobs = logprobs
        self._sent: dict[int, int] = {}
        self._input_sent: set[int] = set()

    @property
    def started(self) -> bool:
        """Whether any output token has been read (a later error is an abort, not a refusal)."""
        return any(self._sent.values())

    def parse(self, payload: bytes) -> object:
        return orjson.loads(payload)

    def feed(self, answer: object) -> list[pb.GenerateResponse]:
        # Only the new ids are checked (a cumulative list's older ids were checked when
        # they were new), and the message is built in place.
        ids, meta, index = _parts(answer, check_ids=False)
        total = meta.get("completion_tokens", 0)
        if type(total) is not int or total < 0:
            total = _count(meta, "completion_tokens")  # None is 0; anything else not a count is refused
        sent = self._sent.get(index, 0)
        fresh = total - sent
        if fresh < 0 or fresh > len(ids):
            raise AnswerError(
                f"completion_tokens went from {sent} to {total} with {len(ids)} output ids"
            )
        new = _ints(ids[len(ids) - fresh:], "output_ids") if fresh else []
        self._sent[index] = total
        logprobs = input_lp = None
        if self._logprobs:
            logprobs = _output_logprobs(meta, fresh)
            if index not in self._input_sent:
                input_lp = _input_logprobs(meta)
                if input_lp is not None:
                    self._input_sent.add(index)
        out = []
        if new:
            message = pb.GenerateResponse(request_id=self._request_id)
            chunk = message.chunk
            chunk.token_ids.extend(new)
            chunk.prompt_tokens = _count(meta, "prompt_tokens")
            chunk.completion_tokens = total
            chunk.cached_tokens = _count(meta, "cached_tokens")
            chunk.index = index
            if logprobs is not None:
                chunk.output_logprobs.CopyFrom(logprobs)
            if input_lp is not None:
                chunk.input_logprobs.CopyFrom(input_lp)
                input_lp = None
            out.append(message)
        finish = _finish(meta) if meta.get("finish_reason") is not None else None
        if finish is not None:
            out.append(_complete(self._request_id, index, new, meta, finish, logprobs, input_lp))
        return out

    def close(self) -> list[pb.GenerateResponse]:
        """Nothing is held: SGLang's finishing answer carries its own counts."""
        return []


def error_message(answer: object) -> str | None:
    """The message of an ``{"error": {"message": ...}}`` answer, else None."""
    if isinstance(answer, dict) and "error" in answer:
        err = answer["error"]
        if isinstance(err, dict):
            return str(err.get("message") or err)
        return str(err)
    return None


__all__ = [
    "AnswerError", "StreamReader", "body_json", "error_message", "generate_body", "prompt_ids", "sampling_params_json",
    "whole_answer", "without_seed",
]
