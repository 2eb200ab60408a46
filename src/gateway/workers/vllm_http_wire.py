"""vLLM's OpenAI server in the worker seam's terms: no I/O, only translation.

vLLM takes token ids as a completion prompt (``"prompt": [ids]``) on
``/v1/completions`` and, asked with ``return_token_ids``, returns the ids it generated
(``choices[].token_ids``; streamed, each chunk carries only its new ids, and the first
one the prompt's ids, ``prompt_token_ids``). A stream asks for usage once, at its end
(``stream_options.include_usage``): that last, choiceless chunk is the only one that
carries cached prompt tokens (``usage.prompt_tokens_details.cached_tokens``, when the
server runs with ``--enable-prompt-tokens-details``; vLLM's per-chunk usage never
does), so a finished choice's complete waits for it, and per-chunk usage is not asked
for: it would only make every chunk longer to write and to read. Logprob rows name
tokens as ``token_id:N`` when asked with ``return_tokens_as_token_ids``. A matched stop
token is ``stop_reason``; an end at EOS has ``finish_reason`` "stop" and no
``stop_reason``. ``/v1/completions`` caps a request that names no ``max_tokens`` (or sends
null) at 16 tokens, the legacy completions default, while vLLM's chat route and its gRPC
servicer let it run to the end of the context: a request with no cap is sent the room its
prompt leaves in the served context, so it ends where it would on vLLM's other routes.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import orjson
from google.protobuf.json_format import MessageToDict

from gateway.proto import sglang_scheduler_pb2 as pb
from gateway.workers.sglang_http_wire import AnswerError, prompt_ids


def completion_body(request: pb.GenerateRequest, model: str, context_length: int = 0) -> dict[str, Any]:
    """The JSON body of ``POST /v1/completions`` for one tokenized request (``body_json`` writes it);
    ``context_length`` is the served model's (``max_model_len``), 0 when unknown."""
    sp = request.sampling_params
    prompt = prompt_ids(request)
    body: dict[str, Any] = {
        "model": model,
        "prompt": prompt,
        "temperature": sp.temperature,
        "top_p": sp.top_p or 1.0,
        "top_k": sp.top_k or -1,
        "min_p": sp.min_p,
        "frequency_penalty": sp.frequency_penalty,
        "presence_penalty": sp.presence_penalty,
        "repetition_penalty": sp.repetition_penalty or 1.0,
        "n": max(1, sp.n),
        "ignore_eos": sp.ignore_eos,
        "skip_special_tokens": sp.skip_special_tokens,
        "spaces_between_special_tokens": sp.spaces_between_special_tokens,
        "stream": request.stream,
        "return_token_ids": True,
    }
    if request.stream:
        body["stream_options"] = {"include_usage": True}
    if sp.HasField("max_new_tokens"):
        body["max_tokens"] = sp.max_new_tokens
    elif context_length > len(prompt):
        body["max_tokens"] = context_length - len(prompt)
    if sp.min_new_tokens:
        body["min_tokens"] = sp.min_new_tokens
    if sp.stop_token_ids:
        body["stop_token_ids"] = list(sp.stop_token_ids)
    if sp.logit_bias:
        body["logit_bias"] = dict(sp.logit_bias)
    custom = MessageToDict(sp.custom_params) if sp.HasField("custom_params") else {}
    if "seed" in custom:
        body["seed"] = int(custom["seed"])
    constraint = sp.WhichOneof("constraint")
    if constraint is not None:
        key = {"regex": "regex", "json_schema": "json", "ebnf_grammar": "grammar", "structural_tag": "structural_tag"}
        body["structured_outputs"] = {key[constraint]: getattr(sp, constraint)}
    if request.return_logprob:
        body["logprobs"] = max(0, request.top_logprobs_num)  # 0: the chosen token's logprob only
        body["return_tokens_as_token_ids"] = True
        if request.logprob_start_len >= 0:
            # The prompt's logprobs: vLLM gives them with ``echo`` (whole and streamed; its
            # ``prompt_logprobs`` field is refused in a stream), ahead of the output's rows.
            body["echo"] = True
    return body


def embedding_body(request: pb.EmbedRequest, model: str) -> dict[str, Any]:
    """The JSON body of ``POST /v1/embeddings`` for one tokenized input (vLLM takes a list
    of ids as one prompt, as the completions route does)."""
    return {"model": model, "input": list(request.tokenized.input_ids)}


def embedding_reply(answer: object) -> pb.EmbedResponse:
    """The first (only) embedding of a ``/v1/embeddings`` answer, in the seam's terms."""
    if not isinstance(answer, dict):
        raise AnswerError("an embeddings answer must be a JSON object")
    data = answer.get("data")
    if not isinstance(data, list) or not data or not isinstance(data[0], dict):
        raise AnswerError("an embeddings answer must hold a list of data objects")
    vector = data[0].get("embedding")
    if not isinstance(vector, list):
        raise AnswerError("embedding must be a list of numbers (encoding_format float)")
    prompt, _ = _usage(answer.get("usage"))
    values = [_float(v) for v in vector]
    return pb.EmbedResponse(embedding=values, embedding_dim=len(values), prompt_tokens=prompt)


def _token_id(name: object) -> int:
    if isinstance(name, str) and name.startswith("token_id:"):
        return int(name[9:])
    raise AnswerError(f"logprob tokens must be 'token_id:N', got {name!r}")


def _float(value: object) -> float:
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    raise AnswerError(f"a logprob must be a number, got {value!r}")


def _logprobs(choice: dict[str, Any], ids: list[int]) -> pb.OutputLogProbs | None:
    lp = choice.get("logprobs")
    if not isinstance(lp, dict) or not ids:
        return None
    values, tops = lp.get("token_logprobs") or [], lp.get("top_logprobs") or []
    if not isinstance(values, list) or not isinstance(tops, list):
        raise AnswerError("logprobs must hold lists of token_logprobs and top_logprobs")
    out = pb.OutputLogProbs(token_logprobs=[_float(v or 0.0) for v in values[-len(ids):]], token_ids=ids)
    for top in tops[-len(ids):]:
        _top_row(top, out.top_logprobs)
    return out


def _top_row(top: object, into: Any) -> None:
    """One ``top_logprobs`` row (``{"token_id:N": logprob}``, or null) added to ``into``."""
    if top is not None and not isinstance(top, dict):
        raise AnswerError("each top_logprobs row must be an object")
    items = list((top or {}).items())
    into.add(values=[_float(v) for _, v in items], token_ids=[_token_id(k) for k, _ in items])


def _input_logprobs(choice: dict[str, Any], ids: list[int], start: int) -> pb.InputLogProbs | None:
    """The prompt's rows that an echo puts ahead of the output's in ``logprobs`` (the first
    prompt token's logprob is null), from prompt position ``start`` on, as the seam has them."""
    lp = choice.get("logprobs")
    if start < 0 or not isinstance(lp, dict):
        return None
    values, tokens, tops = lp.get("token_logprobs"), lp.get("tokens"), lp.get("top_logprobs") or []
    if not isinstance(values, list) or not isinstance(tokens, list) or not isinstance(tops, list):
        raise AnswerError("logprobs must hold lists of tokens, token_logprobs and top_logprobs")
    count = len(values) - len(ids)
    if count <= 0:
        return None
    if len(tokens) < count:
        raise AnswerError("logprobs name fewer tokens than they give logprobs for")
    out = pb.InputLogProbs()
    for pos in range(start, count):
        value = values[pos]
        if value is None:
            out.token_logprobs.add()
        else:
            out.token_logprobs.add(value=_float(value))
        out.token_ids.append(_token_id(tokens[pos]))
        _top_row(tops[pos] if pos < len(tops) else None, out.top_logprobs)
    return out


def _usage(usage: object) -> tuple[int, int]:
    """(prompt_tokens, cached_tokens) of a ``usage`` object, zeros when absent."""
    if not isinstance(usage, dict):
        return 0, 0
    details = usage.get("prompt_tokens_details")
    cached = details.get("cached_tokens") if isinstance(details, dict) else 0
    return int(usage.get("prompt_tokens") or 0), int(cached or 0)


def _choices(answer: object) -> list[dict[str, Any]]:
    if not isinstance(answer, dict):
        raise AnswerError("each answer must be a JSON object")
    choices = answer.get("choices")
    if type(choices) is not list:
        raise AnswerError("choices must be a list of objects")
    for choice in choices:  # a loop, not all() over a generator: most chunks have one choice
        if type(choice) is not dict:
            raise AnswerError("choices must be a list of objects")
    return choices


def _ids(choice: dict[str, Any]) -> list[int]:
    ids = choice.get("token_ids")
    if ids is None:
        raise AnswerError("the answer has no token_ids: the vLLM server must support return_token_ids")
    if type(ids) is not list:
        raise AnswerError("token_ids must be a list of token ids")
    for token in ids:  # most chunks carry one id
        if type(token) is not int:
            raise AnswerError("token_ids must be a list of token ids")
    return ids


def _complete(
    rid: str, index: int, ids: list[int], total: int, prompt: int, cached: int, choice: dict[str, Any],
    logprobs: pb.OutputLogProbs | None, inputs: pb.InputLogProbs | None = None,
) -> pb.GenerateResponse:
    message = pb.GenerateResponse(request_id=rid)
    complete = message.complete  # filled in place: a message passed to a constructor is copied
    complete.output_ids.extend(ids)
    complete.finish_reason = str(choice.get("finish_reason"))
    complete.prompt_tokens = prompt
    complete.completion_tokens = total
    complete.cached_tokens = cached
    complete.index = index
    stop = choice.get("stop_reason")
    if isinstance(stop, int) and not isinstance(stop, bool):
        complete.matched_token_id = stop
    elif isinstance(stop, str):
        complete.matched_stop_str = stop
    if logprobs is not None:
        complete.output_logprobs.CopyFrom(logprobs)
    if inputs is not None:
        complete.input_logprobs.CopyFrom(inputs)
    return message


def whole_completion(rid: str, answer: object, prompt_start: int = -1) -> list[pb.GenerateResponse]:
    """A non-streamed completion as one complete per choice; with ``prompt_start`` >= 0 the
    prompt's logprobs from that position on (the request asked for them: ``echo``)."""
    choices = _choices(answer)
    prompt, cached = _usage(answer.get("usage"))  # type: ignore[attr-defined]
    out = []
    for position, choice in enumerate(choices):
        ids = _ids(choice)
        index = int(choice.get("index", position))
        out.append(_complete(
            rid, index, ids, len(ids), prompt, cached, choice, _logprobs(choice, ids),
            _input_logprobs(choice, ids, prompt_start),
        ))
    return out


_PROMPT_IDS = b'"prompt_token_ids"'
# The key and a flat list of ids; a JSON string cannot hold the key's closing quote unescaped,
# so this matches the key itself and nothing inside a text.
_PROMPT_IDS_LIST = re.compile(rb'"prompt_token_ids"\s*:\s*\[[0-9,\s]*\]')


def without_prompt_ids(payload: bytes) -> bytes:
    """``payload`` with its ``prompt_token_ids`` list written as ``null``. vLLM puts the
    prompt's ids in a stream's first chunk (``return_token_ids`` asks for the generated ones
    and brings those along); the gateway sent them and knows their count, and parsing them
    makes a Python int per id, more JSON work than the rest of the answer for a long prompt.
    Only a flat list of numbers is replaced; anything else is left for the parser to read
    (or refuse)."""
    if _PROMPT_IDS not in payload:
        return payload
    return _PROMPT_IDS_LIST.sub(b'"prompt_token_ids":null', payload)


class CompletionStreamReader:
    """Turns streamed completion chunks into the chunks and completes a gRPC worker sends.

    Once per streamed token, so the common chunk (one choice, new ids, no logprobs) is
    read with as few lookups as its checks allow and its message built in place. A
    finished choice's last chunk and its complete are held until the closing usage chunk
    brings the prompt and cached counts, or until the stream ends without one
    (``close``): both then come in one read, as the finishing answer of a worker that
    sends its counts with it does, so the relay ends the sample in one wake-up. With
    ``prompt_start`` >= 0 (the request asked for the prompt's logprobs: ``echo``), each
    choice's first chunk brings them ahead of its own rows; they go with that sample's
    first message. ``prompt_tokens``: the length of the prompt the request sent, when known
    (its ids in the first chunk are then not parsed: ``parse``)."""

    __slots__ = ("_cached", "_echoed", "_held", "_inputs", "_prompt", "_prompt_start", "_request_id", "_sent")

    def __init__(self, request_id: str, prompt_start: int = -1, prompt_tokens: int = 0) -> None:
        self._request_id = request_id
        self._prompt_start = prompt_start
        self._inputs: dict[int, pb.InputLogProbs] = {}  # per sample, until its first message
        self._echoed: set[int] = set()  # the samples whose prompt rows were read
        self._sent: dict[int, int] = {}
        # The prompt's length: the request's, else the first chunk's prompt_token_ids; then usage's.
        self._prompt = prompt_tokens
        self._cached = 0
        self._held: list[tuple[int, list[int], int, dict[str, Any], pb.OutputLogProbs | None]] = []

    @property
    def started(self) -> bool:
        return any(self._sent.values())

    def parse(self, payload: bytes) -> object:
        """One chunk's JSON; the prompt's ids left unread when the request's length is known."""
        return orjson.loads(without_prompt_ids(payload) if self._prompt else payload)

    def _note(self, usage: object) -> None:
        prompt, cached = _usage(usage)
        if prompt:
            self._prompt = prompt
        if cached:
            self._cached = cached

    def _chunk(self, index: int, ids: list[int], total: int, logprobs: pb.OutputLogProbs | None) -> pb.GenerateResponse:
        message = pb.GenerateResponse(request_id=self._request_id)
        if self._inputs:
            inputs = self._inputs.pop(index, None)
            if inputs is not None:
                message.chunk.input_logprobs.CopyFrom(inputs)
        chunk = message.chunk
        chunk.token_ids.extend(ids)
        chunk.prompt_tokens = self._prompt
        chunk.completion_tokens = total
        chunk.cached_tokens = self._cached
        chunk.index = index
        if logprobs is not None:
            chunk.output_logprobs.CopyFrom(logprobs)
        return message

    def _release(self) -> Iterator[pb.GenerateResponse]:
        held, self._held = self._held, []
        for index, ids, total, choice, logprobs in held:
            if ids:
                yield self._chunk(index, ids, total, logprobs)
            inputs = self._inputs.pop(index, None) if self._inputs else None
            yield _complete(self._request_id, index, ids, total, self._prompt, self._cached, choice, logprobs, inputs)

    def feed(self, answer: object) -> list[pb.GenerateResponse]:
        choices = _choices(answer)
        out = []
        usage = answer.get("usage")  # type: ignore[attr-defined]
        if usage is not None:
            self._note(usage)
        for choice in choices:
            index = choice.get("index", 0)
            if type(index) is not int or index < 0:
                raise AnswerError(f"index must be a non-negative integer, got {index!r}")
            ids = _ids(choice)
            if not self._prompt:
                prompt_ids = choice.get("prompt_token_ids")
                if isinstance(prompt_ids, list):
                    self._prompt = len(prompt_ids)
            total = self._sent.get(index, 0) + len(ids)
            self._sent[index] = total
            logprobs = _logprobs(choice, ids) if choice.get("logprobs") else None
            if self._prompt_start >= 0 and index not in self._echoed:
                self._first_rows(index, choice, ids)
            if choice.get("finish_reason") is not None:
                self._held.append((index, ids, total, choice, logprobs))
            elif ids:
                out.append(self._chunk(index, ids, total, logprobs))
        if not choices and self._held:  # the closing usage chunk
            out.extend(self._release())
        return out

    def _first_rows(self, index: int, choice: dict[str, Any], ids: list[int]) -> None:
        """Keep the prompt's rows of a sample's first chunk until its first message."""
        if choice.get("logprobs"):
            self._echoed.add(index)
            rows = _input_logprobs(choice, ids, self._prompt_start)
            if rows is not None:
                self._inputs[index] = rows

    def close(self) -> Iterator[pb.GenerateResponse]:
        """The completes still held when the stream ended without a usage chunk."""
        return self._release()


__all__ = [
    "CompletionStreamReader", "completion_body", "embedding_body", "embedding_reply", "whole_completion",
    "without_prompt_ids",
]
