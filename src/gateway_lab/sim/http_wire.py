"""SGLang's native HTTP shapes for the simulated worker: JSON in, JSON out.

The HTTP mode runs the same servicer as the gRPC mode (same validation, cache and
step loop); this module only turns a ``/generate`` body into the servicer's request
and the servicer's messages into the dicts SGLang's HTTP server sends: ``output_ids``
so far (SGLang's default, cumulative), ``meta_info`` with ``id``, ``finish_reason``
(``{"type", "matched"}`` or null while running), ``prompt_tokens``,
``completion_tokens``, ``cached_tokens`` and the logprob lists as
``[logprob, token_id, text]`` rows (text null: the gateway detokenizes).
It is written from SGLang's behaviour, not from the gateway's client, so it stays
an independent witness of that client.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from google.protobuf import struct_pb2

from gateway.proto import sglang_scheduler_pb2 as pb
from gateway_lab.sim.completion_logprobs import LogprobRows


class BadBody(ValueError):
    """A ``/generate`` body SGLang's HTTP server would refuse (HTTP 400)."""


_SAMPLING_FLOATS = ("temperature", "top_p", "min_p", "frequency_penalty", "presence_penalty", "repetition_penalty")
_SAMPLING_FLAGS = ("skip_special_tokens", "spaces_between_special_tokens", "ignore_eos", "no_stop_trim")
_CONSTRAINTS = ("regex", "json_schema", "ebnf", "structural_tag")


def _sampling(params: Any) -> pb.SamplingParams:
    if params is None:
        params = {}
    if not isinstance(params, dict):
        raise BadBody("sampling_params must be an object")
    sp = pb.SamplingParams(
        temperature=float(params.get("temperature", 1.0)),
        top_k=int(params.get("top_k", -1)),
        n=int(params.get("n", 1)),
        min_new_tokens=int(params.get("min_new_tokens", 0)),
        stop_token_ids=[int(t) for t in params.get("stop_token_ids") or []],
    )
    for name in _SAMPLING_FLOATS[1:]:
        if name in params:
            setattr(sp, name, float(params[name]))
    for name in _SAMPLING_FLAGS:
        if name in params:
            setattr(sp, name, bool(params[name]))
    if params.get("max_new_tokens") is not None:
        sp.max_new_tokens = int(params["max_new_tokens"])
    if params.get("stream_interval") is not None:
        sp.stream_interval = int(params["stream_interval"])
    stop = params.get("stop")
    if stop:
        sp.stop.extend([stop] if isinstance(stop, str) else [str(s) for s in stop])
    for name in _CONSTRAINTS:
        if params.get(name):
            setattr(sp, "ebnf_grammar" if name == "ebnf" else name, str(params[name]))
    custom = dict(params.get("custom_params") or {})
    if params.get("sampling_seed") is not None:
        custom.setdefault("seed", params["sampling_seed"])
    if custom:
        sp.custom_params.CopyFrom(struct_pb2.Struct())
        sp.custom_params.update(custom)
    return sp


def generate_request(body: Any, request_id: str) -> pb.GenerateRequest:
    """A ``/generate`` body (token ids only: the sim has no text tokenizer path) as the
    servicer's request. Raises :class:`BadBody`."""
    if not isinstance(body, dict):
        raise BadBody("the body must be a JSON object")
    ids = body.get("input_ids")
    if ids is None:
        raise BadBody("this worker takes input_ids (text prompts need a tokenizer)")
    if not isinstance(ids, list) or not all(isinstance(t, int) and t >= 0 for t in ids):
        raise BadBody("input_ids must be a list of token ids (one prompt)")
    try:
        request = pb.GenerateRequest(
            request_id=str(body.get("rid") or request_id),
            tokenized=pb.TokenizedInput(input_ids=ids),
            sampling_params=_sampling(body.get("sampling_params")),
            stream=bool(body.get("stream", False)),
            return_logprob=bool(body.get("return_logprob", False)),
            logprob_start_len=int(body.get("logprob_start_len", -1)),
            top_logprobs_num=int(body.get("top_logprobs_num", 0)),
            token_ids_logprob=[int(t) for t in body.get("token_ids_logprob") or []],
        )
        if body.get("data_parallel_rank") is not None:
            request.data_parallel_rank = int(body["data_parallel_rank"])
        if body.get("bootstrap_host"):
            request.disaggregated_params.CopyFrom(pb.DisaggregatedParams(
                bootstrap_host=str(body["bootstrap_host"]),
                bootstrap_port=int(body.get("bootstrap_port") or 0),
                bootstrap_room=int(body.get("bootstrap_room") or 0),
            ))
    except (TypeError, ValueError, OverflowError) as exc:
        raise BadBody(f"malformed field: {exc}") from None
    return request


def _rows(logprobs: pb.OutputLogProbs) -> list[list[Any]]:
    return [[lp, tid, None] for lp, tid in zip(logprobs.token_logprobs, logprobs.token_ids, strict=False)]


def _tops(logprobs: pb.OutputLogProbs) -> list[list[list[Any]]]:
    return [
        [[v, t, None] for v, t in zip(top.values, top.token_ids, strict=False)]
        for top in logprobs.top_logprobs
    ]


class AnswerBuilder:
    """The SGLang answer dicts of one request, sample by sample (``index``)."""

    def __init__(self, request_id: str) -> None:
        self.request_id = request_id
        self.output: dict[int, list[int]] = {}
        self._lp_rows: dict[int, list[list[Any]]] = {}
        self._lp_tops: dict[int, list[list[list[Any]]]] = {}
        self._input: dict[int, dict[str, Any]] = {}

    def _add(self, index: int, ids: list[int], completion_tokens: int, lp: pb.OutputLogProbs | None) -> None:
        out = self.output.setdefault(index, [])
        # A complete repeats the ids of the last chunk: take only what is past the count.
        fresh = max(0, completion_tokens - len(out))
        if fresh:
            out.extend(ids[len(ids) - fresh:])
            if lp is not None and lp.token_ids:
                self._lp_rows.setdefault(index, []).extend(_rows(lp)[-fresh:])
                self._lp_tops.setdefault(index, []).extend(_tops(lp)[-fresh:])

    def _input_lp(self, index: int, lp: pb.InputLogProbs) -> None:
        if index in self._input or not lp.token_ids:
            return
        self._input[index] = {
            "input_token_logprobs": [
                [v.value if v.HasField("value") else None, t, None]
                for v, t in zip(lp.token_logprobs, lp.token_ids, strict=False)
            ],
            "input_top_logprobs": [
                [[v, t, None] for v, t in zip(top.values, top.token_ids, strict=False)] or None
                for top in lp.top_logprobs
            ],
        }

    def _answer(self, index: int, counts: Any, finish: dict[str, Any] | None, logprob: bool) -> dict[str, Any]:
        meta: dict[str, Any] = {
            "id": self.request_id,
            "finish_reason": finish,
            "prompt_tokens": counts.prompt_tokens,
            "completion_tokens": counts.completion_tokens,
            "cached_tokens": counts.cached_tokens,
        }
        if logprob:
            meta["output_token_logprobs"] = list(self._lp_rows.get(index, []))
            meta["output_top_logprobs"] = list(self._lp_tops.get(index, []))
            meta.update(self._input.get(index, {}))
        return {"text": "", "output_ids": list(self.output.get(index, [])), "meta_info": meta, "index": index}

    def chunk(self, chunk: pb.GenerateStreamChunk, logprob: bool) -> dict[str, Any]:
        self._add(chunk.index, list(chunk.token_ids), chunk.completion_tokens,
                  chunk.output_logprobs if chunk.HasField("output_logprobs") else None)
        if chunk.HasField("input_logprobs"):
            self._input_lp(chunk.index, chunk.input_logprobs)
        return self._answer(chunk.index, chunk, None, logprob)

    def complete(self, complete: pb.GenerateComplete, logprob: bool) -> dict[str, Any]:
        self._add(complete.index, list(complete.output_ids), complete.completion_tokens,
                  complete.output_logprobs if complete.HasField("output_logprobs") else None)
        if complete.HasField("input_logprobs"):
            self._input_lp(complete.index, complete.input_logprobs)
        finish: dict[str, Any] = {"type": complete.finish_reason}
        which = complete.WhichOneof("matched_stop")
        if which is not None:
            finish["matched"] = getattr(complete, which)
        elif complete.finish_reason == "length":
            finish["length"] = complete.completion_tokens
        return self._answer(complete.index, complete, finish, logprob)




# ------------------------------------------------------------------ vLLM's OpenAI server


def completion_request(
    body: Any, request_id: str, tokenize: Callable[[str], list[int]] | None = None
) -> pb.GenerateRequest:
    """A ``/v1/completions`` body as the servicer's request: a token-id prompt (vLLM's
    ``return_token_ids`` form), or a text prompt when ``tokenize`` is given (SGLang's
    OpenAI route, which a gateway that forwards text, such as SMG over HTTP, calls)."""
    if not isinstance(body, dict):
        raise BadBody("the body must be a JSON object")
    prompt = body.get("prompt")
    if isinstance(prompt, str) and prompt and tokenize is not None:
        prompt = tokenize(prompt)
    if not isinstance(prompt, list) or not prompt or not all(isinstance(t, int) for t in prompt):
        raise BadBody("prompt must be a list of token ids" + (" or a non-empty text" if tokenize else ""))
    logprobs = body.get("logprobs")
    if logprobs is not None and (type(logprobs) is not int or logprobs < 0):
        raise BadBody("logprobs must be a non-negative integer")
    params: dict[str, Any] = {
        key: body[src] for src, key in (
            ("temperature", "temperature"), ("top_p", "top_p"), ("top_k", "top_k"), ("n", "n"),
            ("max_tokens", "max_new_tokens"), ("min_tokens", "min_new_tokens"), ("stop_token_ids", "stop_token_ids"),
            ("ignore_eos", "ignore_eos"), ("seed", "sampling_seed"), ("repetition_penalty", "repetition_penalty"),
        ) if body.get(src) is not None
    }
    shape: dict[str, Any] = {"rid": request_id, "input_ids": prompt, "sampling_params": params, "stream": bool(body.get("stream"))}
    if logprobs is not None:  # vLLM's ``echo`` adds the prompt's rows, from its first token
        shape.update(return_logprob=True, top_logprobs_num=logprobs, logprob_start_len=0 if body.get("echo") else -1)
    return generate_request(shape, request_id)


class CompletionBuilder:
    """The completion objects vLLM sends for one request (``return_token_ids``: the
    prompt's ids on each choice's first chunk, new ids per streamed chunk, all ids in a
    whole answer). As in vLLM, per-chunk usage (``continuous_usage_stats``) has the
    token counts only; cached prompt tokens come in the whole answer's usage and in the
    closing usage chunk of a stream (a server run with ``--enable-prompt-tokens-details``).
    With ``decode`` each choice also carries its tokens' text, as a server that detokenizes
    (SGLang's) sends it; without, the text is empty and the ids are the answer. With
    ``logprobs`` each choice carries the rows of the tokens it sends (``LogprobRows``)."""

    def __init__(
        self, request_id: str, model: str, decode: Callable[[list[int]], str] | None = None,
        prompt_ids: Sequence[int] = (), logprobs: LogprobRows | None = None,
    ) -> None:  # fmt: skip
        self.request_id = request_id
        self.model = model
        self.decode = decode
        self.prompt_ids = list(prompt_ids)
        self.logprobs = logprobs
        self.sent: dict[int, int] = {}
        self.prompted: set[int] = set()  # the choices whose prompt ids were sent
        self.prompt_tokens = 0
        self.cached_tokens = 0

    def _note(self, counts: Any) -> None:
        self.prompt_tokens = counts.prompt_tokens
        self.cached_tokens = max(self.cached_tokens, counts.cached_tokens)

    def _usage(self, details: bool) -> dict[str, Any]:
        total = sum(self.sent.values())
        usage: dict[str, Any] = {
            "prompt_tokens": self.prompt_tokens, "completion_tokens": total, "total_tokens": self.prompt_tokens + total,
        }  # fmt: skip
        if details:
            usage["prompt_tokens_details"] = {"cached_tokens": self.cached_tokens}
        return usage

    def _delta(self, index: int, ids: list[int], completion_tokens: int) -> list[int]:
        fresh = max(0, completion_tokens - self.sent.get(index, 0))
        self.sent[index] = max(self.sent.get(index, 0), completion_tokens)
        return ids[len(ids) - fresh:] if fresh else []

    def _choice(self, index: int, ids: list[int], finish: str | None, stop: Any) -> dict[str, Any]:
        choice: dict[str, Any] = {
            "index": index, "text": self._text(ids), "logprobs": self.logprobs.take(index) if self.logprobs else None,
            "token_ids": ids, "finish_reason": finish, "stop_reason": stop,
        }  # fmt: skip
        if self.prompt_ids and index not in self.prompted:
            choice["prompt_token_ids"] = self.prompt_ids
            self.prompted.add(index)
        return choice

    def _object(self, choices: list[dict[str, Any]], usage: bool) -> dict[str, Any]:
        return {
            "id": f"cmpl-{self.request_id}", "object": "text_completion", "model": self.model,
            "choices": choices, "usage": self._usage(False) if usage else None,
        }

    def _text(self, ids: list[int]) -> str:
        return self.decode(ids) if self.decode is not None and ids else ""

    def _rows(self, index: int, message: pb.GenerateStreamChunk | pb.GenerateComplete, fresh: int) -> None:
        if self.logprobs is None:
            return
        if message.HasField("input_logprobs"):
            self.logprobs.add_prompt(index, message.input_logprobs)
        if message.HasField("output_logprobs"):
            self.logprobs.add_output(index, message.output_logprobs, fresh)

    def carry(self, chunk: pb.GenerateStreamChunk) -> list[int]:
        """A chunk's new ids, kept for the object that will carry them (the finishing one)."""
        self._note(chunk)
        ids = self._delta(chunk.index, list(chunk.token_ids), chunk.completion_tokens)
        self._rows(chunk.index, chunk, len(ids))
        return ids

    def chunk(self, chunk: pb.GenerateStreamChunk, usage: bool) -> dict[str, Any]:
        ids = self.carry(chunk)
        return self._object([self._choice(chunk.index, ids, None, None)], usage)

    def finish(self, complete: pb.GenerateComplete, usage: bool, carried: list[int]) -> dict[str, Any]:
        fresh = self._delta(complete.index, list(complete.output_ids), complete.completion_tokens)
        self._rows(complete.index, complete, len(fresh))
        ids = carried + fresh
        self._note(complete)
        which = complete.WhichOneof("matched_stop")
        stop = getattr(complete, which) if which is not None else None
        return self._object([self._choice(complete.index, ids, complete.finish_reason, stop)], usage)

    def usage_only(self) -> dict[str, Any]:
        """The closing usage chunk of a stream, and the usage of a whole answer."""
        out = self._object([], False)
        out["usage"] = self._usage(True)
        return out


__all__ = ["AnswerBuilder", "BadBody", "CompletionBuilder", "completion_request", "generate_request"]
