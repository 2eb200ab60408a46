"""How large one message from a worker may honestly be, worked out from the request.

A worker is trusted no more than a client. A gRPC message or an HTTP answer is held
whole in memory before anything can look at it, so the largest one accepted is what a
hostile worker can make the gateway hold per call. Every reader of worker replies (the
grpc.aio channels, the gateway's own HTTP/2 reader in ``workers/h2``, the HTTP worker
clients) refuses a message past the bound for its call, so it never grows past it:

* a Generate reply: the token ids, logprob rows and prompt logprobs the request can
  bring back (``grpc_reply_bytes``, ``json_reply_bytes``), with room to spare, never
  more than ``MAX_REPLY_BYTES``;
* every other call (loads, model and server info, health, abort, flush, embeddings):
  ``CONTROL_REPLY_BYTES``; KV event batches ``KV_EVENT_REPLY_BYTES``.

grpc.aio bounds messages per channel, not per call, so its Generate calls run on one of
a few channels whose bounds are powers of four (``channel_bound``): a request needing
5 MiB goes to the 16 MiB channel, never to one that admits 256 MiB.
"""

from __future__ import annotations

from gateway.proto import sglang_scheduler_pb2 as pb
from gateway.workers.transport import CallCode, WorkerCallError

CONTROL_REPLY_BYTES = 4 << 20
"""Largest reply to a call that is not Generate (gRPC's own default receive limit)."""

KV_EVENT_REPLY_BYTES = 16 << 20
"""Largest KV event batch (stored blocks carry their token ids: a long prefill's fit)."""

MAX_REPLY_BYTES = 256 << 20
"""No Generate reply is accepted past this, whatever the request asked."""

FORWARDED_ANSWER_BYTES = 32 << 20
"""Largest whole (not streamed) answer taken from an OpenAI-compatible backend: the
gateway forwards its request unread, so no bound can be computed from it; a stream is
passed on piece by piece and holds none of it."""

BASE_REPLY_BYTES = 64 << 10
"""What any Generate reply may take besides its tokens (ids, counts, reasons, stop text)."""

UNSET_OUTPUT_TOKENS = 1 << 20
"""Tokens a sample may bring back when the request does not say (the gateway cuts the
output there too)."""

SLACK = 2
"""Room over the worked-out size: encodings differ (a float field, a repeated row)."""

# Encoded sizes on the gRPC wire: a uint32 varint is at most 5 bytes, a float 4, and a
# logprob row (a TopLogProbs message: tag, length and two packed fields) adds 16.
_ID, _FLOAT, _ROW = 5, 4, 16
# On the JSON wire: an id, a logprob and the token's text with quotes, escapes and
# separators. SGLang writes ``[logprob, id, text]`` triples; the text of one token is
# at most a few hundred bytes even escaped.
_JSON_ID, _JSON_ENTRY, _JSON_TEXT = 12, 64, 512


def _shape(request: pb.GenerateRequest) -> tuple[int, int, int]:
    """(output tokens, entries per logprob position, prompt positions with logprobs)."""
    sp = request.sampling_params
    tokens = sp.max_new_tokens if sp.HasField("max_new_tokens") and sp.max_new_tokens > 0 else UNSET_OUTPUT_TOKENS
    if not request.return_logprob:
        return tokens, 0, 0
    # the sampled token, its top alternatives and the rows of asked-for ids
    entries = 1 + max(0, request.top_logprobs_num) + len(request.token_ids_logprob)
    # vLLM sends every prompt position whatever the start: count them all
    prompt = len(request.tokenized.input_ids) if request.logprob_start_len >= 0 else 0
    return tokens, entries, prompt


def grpc_reply_bytes(request: pb.GenerateRequest) -> int:
    """The largest Generate message (protobuf) a worker may send for ``request``."""
    tokens, entries, prompt = _shape(request)
    per_position = _ID + (3 * _ROW + entries * (_ID + _FLOAT) if entries else 0)
    need = BASE_REPLY_BYTES + tokens * per_position + prompt * (per_position + _ROW)
    return min(MAX_REPLY_BYTES, SLACK * need)


def json_reply_bytes(request: pb.GenerateRequest) -> int:
    """The largest answer (one whole JSON body, or one streamed line) an HTTP worker may
    send for ``request``: its ids, its text and its logprob triples."""
    tokens, entries, prompt = _shape(request)
    per_position = _JSON_ID + _JSON_TEXT + entries * (_JSON_ENTRY + _JSON_TEXT)
    need = BASE_REPLY_BYTES + tokens * per_position + prompt * per_position
    return min(MAX_REPLY_BYTES, SLACK * need)


def channel_bound(need: int) -> int:
    """The receive bound of the grpc.aio channel a call needing ``need`` bytes runs on:
    the smallest power of four from ``CONTROL_REPLY_BYTES`` that fits, at most
    ``MAX_REPLY_BYTES``."""
    bound = CONTROL_REPLY_BYTES
    while bound < need and bound < MAX_REPLY_BYTES:
        bound *= 4
    return min(bound, MAX_REPLY_BYTES)


class ReplyTooLarge(WorkerCallError):
    """A worker's message went past the bound of its call: the worker's fault (the
    client sees 502 ``worker_reply_too_large``, the worker's breaker a failure)."""

    __slots__ = ("bound", "size")

    def __init__(self, size: int | None, bound: int) -> None:
        got = f"{size} bytes" if size is not None else "more"
        super().__init__(
            CallCode.RESOURCE_EXHAUSTED, f"the worker's reply is larger than this request allows ({got} vs. {bound})"
        )
        self.size = size
        self.bound = bound


GRPC_TOO_LARGE = "Received message larger than max"
"""How grpc.aio words a message over its channel's receive bound."""
