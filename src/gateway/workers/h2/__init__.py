"""The gateway's own HTTP/2 reader for the workers' Generate streams.

Why not grpc.aio for this one call: every streamed token is one gRPC message, and
grpc.aio hands each message over on its own (a completion-queue operation, a
hand-off from gRPC's poller thread, a task wake-up), even when many arrived in the
same socket read. Profiles of the relay put that at a large share of the
gateway's CPU per token, and no grpc.aio API reads
"what has already arrived". Here one socket read is cut into frames and messages in
one pass, its messages are parsed with one protobuf parse (``batch.py``), each call with
new messages is woken once, and a reader sees how many are waiting (``H2Call.ready``),
so the relay can write them in one go.

Scope, on purpose small: unary-request, server-streaming calls (Generate), on
``grpc://`` (HTTP/2 with prior knowledge) and ``grpcs://`` (TLS, ALPN h2); identity
encoding only; the worker's response headers decoded by the ``hpack`` library. Every
other RPC (health, loads, abort, embeddings, tokenizer, KV events) stays on grpc.aio,
and so can Generate (``--worker-stream-transport grpcio``). Calls behave as
grpc.aio's do for the gateway, in the terms of ``workers/transport``: ``END_OF_STREAM``
at the end, ``WorkerCallError`` with the worker's status and details on failure, deadlines (``grpc-timeout`` and a
local timer), cancellation both ways, GOAWAY and lost connections as UNAVAILABLE.
"""

from gateway.workers.h2.call import CallStatus, H2Call
from gateway.workers.h2.channel import H2Channel
from gateway.workers.h2.connection import H2Connection

__all__ = ["CallStatus", "H2Call", "H2Channel", "H2Connection"]
