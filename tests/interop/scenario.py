"""What the official-stub peer answers in the live interop tests, as plain data.

Both processes import this (it imports nothing from `gateway` and no generated
code): the official servicer builds its replies from these plans, and the test
builds the replies it expects from the same plans with token-gateway's classes.
"""

from __future__ import annotations

from .populate import SET, ZERO, Plan

SCHEDULER = "sglang.grpc.scheduler"
COMMON = "smg.grpc.common"
_RESPONSE = f"{SCHEDULER}.GenerateResponse.response"
_MATCHED = f"{SCHEDULER}.GenerateComplete.matched_stop"
_CONSTRAINT = f"{SCHEDULER}.SamplingParams.constraint"

# Streaming Generate: two chunks, then the complete (stopped on a token id).
STREAM_REPLIES = (
    Plan(11, SET, {_RESPONSE: "chunk"}),
    Plan(12, SET, {_RESPONSE: "chunk"}),
    Plan(13, SET, {_RESPONSE: "complete", _MATCHED: "matched_token_id"}),
)
# Non-streaming Generate: one complete (stopped on a string).
UNARY_REPLIES = (Plan(14, SET, {_RESPONSE: "complete", _MATCHED: "matched_stop_str"}),)

# Requests the test sends (ZERO keeps `optional` fields present with value 0).
GENERATE_REQUEST = Plan(7, SET, {_CONSTRAINT: "json_schema"})
GET_LOADS_REQUEST = Plan(8, ZERO)
ABORT_REQUEST = Plan(9, SET)
EMBED_REQUEST = Plan(10, SET, {_CONSTRAINT: "ebnf_grammar"})
FLUSH_REQUEST = Plan(15, SET)
SUBSCRIBE_REQUEST = Plan(16, SET)

# Unary replies, by method name: (reply type, plan).
UNARY_REPLY_PLANS: dict[str, tuple[str, Plan]] = {
    "HealthCheck": (f"{SCHEDULER}.HealthCheckResponse", Plan(21)),
    "Abort": (f"{SCHEDULER}.AbortResponse", Plan(22)),
    "GetModelInfo": (f"{SCHEDULER}.GetModelInfoResponse", Plan(23)),
    "GetServerInfo": (f"{SCHEDULER}.GetServerInfoResponse", Plan(24)),
    "GetLoads": (f"{SCHEDULER}.GetLoadsResponse", Plan(25)),
    "Embed": (f"{SCHEDULER}.EmbedResponse", Plan(26)),
    "FlushCache": (f"{COMMON}.FlushCacheResponse", Plan(27)),
}

# SubscribeKvEvents: one batch per event kind mix, every optional section set.
KV_EVENT_REPLIES = (
    Plan(
        31,
        SET,
        {f"{COMMON}.KvCacheEvent.data": "stored", f"{COMMON}.KvBlockExtraKey.key": "multimodal"},
    ),
    Plan(32, SET, {f"{COMMON}.KvCacheEvent.data": "removed"}),
    Plan(33, ZERO, {f"{COMMON}.KvCacheEvent.data": "cleared"}),
)

# GetTokenizer: these bytes in pieces of this size; the last piece carries the sha256.
TOKENIZER_ZIP = bytes(range(256)) * 5
TOKENIZER_PIECE = 500

# What the official vLLM peer (official_side.py serve-vllm) answers: a streamed answer in two
# chunks (each with its own count, no request id) and a complete repeating the last chunk;
# an unstreamed one as one complete per sample with every id; the facts a vLLM server reports.
VLLM_STREAM = ((11, 12), (13,))
VLLM_UNARY = (11, 12, 13)
VLLM_PROMPT_TOKENS = 40
VLLM_CACHED = 32
VLLM_BLOCK = 16
VLLM_KV = 9000
VLLM_CONTEXT = 4096

# What the official TensorRT-LLM peer (official_side.py serve-trtllm) answers: streamed, an
# empty chunk, two chunks with running counts and a complete holding every id (stopped on
# a stop word); unstreamed, the complete alone; the facts its servicer reports.
TRT_STREAM = ((21, 22), (23,))
TRT_PROMPT_TOKENS = 40
TRT_CACHED = 16
TRT_CONTEXT = 4096
TRT_VOCAB = 1000
