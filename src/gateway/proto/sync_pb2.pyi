from gateway.proto import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Decision(_message.Message):
    __slots__ = ("worker_id", "model", "pool", "tokens", "prompt_tokens", "predicted_cached", "decided_unix_ns", "prefix_hash", "prefix_blocks", "block_tokens", "id", "extends")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    POOL_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    PREDICTED_CACHED_FIELD_NUMBER: _ClassVar[int]
    DECIDED_UNIX_NS_FIELD_NUMBER: _ClassVar[int]
    PREFIX_HASH_FIELD_NUMBER: _ClassVar[int]
    PREFIX_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    BLOCK_TOKENS_FIELD_NUMBER: _ClassVar[int]
    ID_FIELD_NUMBER: _ClassVar[int]
    EXTENDS_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    model: str
    pool: str
    tokens: bytes
    prompt_tokens: int
    predicted_cached: int
    decided_unix_ns: int
    prefix_hash: int
    prefix_blocks: int
    block_tokens: int
    id: int
    extends: int
    def __init__(self, worker_id: _Optional[str] = ..., model: _Optional[str] = ..., pool: _Optional[str] = ..., tokens: _Optional[bytes] = ..., prompt_tokens: _Optional[int] = ..., predicted_cached: _Optional[int] = ..., decided_unix_ns: _Optional[int] = ..., prefix_hash: _Optional[int] = ..., prefix_blocks: _Optional[int] = ..., block_tokens: _Optional[int] = ..., id: _Optional[int] = ..., extends: _Optional[int] = ...) -> None: ...

class Finish(_message.Message):
    __slots__ = ("worker_id", "model", "pool", "cached_tokens", "success", "decision")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    POOL_FIELD_NUMBER: _ClassVar[int]
    CACHED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    SUCCESS_FIELD_NUMBER: _ClassVar[int]
    DECISION_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    model: str
    pool: str
    cached_tokens: int
    success: bool
    decision: int
    def __init__(self, worker_id: _Optional[str] = ..., model: _Optional[str] = ..., pool: _Optional[str] = ..., cached_tokens: _Optional[int] = ..., success: _Optional[bool] = ..., decision: _Optional[int] = ...) -> None: ...

class WorkerLoad(_message.Message):
    __slots__ = ("worker_id", "in_flight", "queued_uncached_prefill_tokens", "running_decode_tokens", "queued_prompt_tokens")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    IN_FLIGHT_FIELD_NUMBER: _ClassVar[int]
    QUEUED_UNCACHED_PREFILL_TOKENS_FIELD_NUMBER: _ClassVar[int]
    RUNNING_DECODE_TOKENS_FIELD_NUMBER: _ClassVar[int]
    QUEUED_PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    in_flight: int
    queued_uncached_prefill_tokens: int
    running_decode_tokens: int
    queued_prompt_tokens: int
    def __init__(self, worker_id: _Optional[str] = ..., in_flight: _Optional[int] = ..., queued_uncached_prefill_tokens: _Optional[int] = ..., running_decode_tokens: _Optional[int] = ..., queued_prompt_tokens: _Optional[int] = ...) -> None: ...

class KvEvents(_message.Message):
    __slots__ = ("worker_id", "batch", "reset", "parts", "part", "want_share")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    BATCH_FIELD_NUMBER: _ClassVar[int]
    RESET_FIELD_NUMBER: _ClassVar[int]
    PARTS_FIELD_NUMBER: _ClassVar[int]
    PART_FIELD_NUMBER: _ClassVar[int]
    WANT_SHARE_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    batch: _common_pb2.KvEventBatch
    reset: bool
    parts: int
    part: int
    want_share: bool
    def __init__(self, worker_id: _Optional[str] = ..., batch: _Optional[_Union[_common_pb2.KvEventBatch, _Mapping]] = ..., reset: _Optional[bool] = ..., parts: _Optional[int] = ..., part: _Optional[int] = ..., want_share: _Optional[bool] = ...) -> None: ...

class Batch(_message.Message):
    __slots__ = ("origin", "seq", "sent_unix_ns", "decisions", "finishes", "loads", "full_loads", "goodbye", "replay", "host_set", "kv_events")
    ORIGIN_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    SENT_UNIX_NS_FIELD_NUMBER: _ClassVar[int]
    DECISIONS_FIELD_NUMBER: _ClassVar[int]
    FINISHES_FIELD_NUMBER: _ClassVar[int]
    LOADS_FIELD_NUMBER: _ClassVar[int]
    FULL_LOADS_FIELD_NUMBER: _ClassVar[int]
    GOODBYE_FIELD_NUMBER: _ClassVar[int]
    REPLAY_FIELD_NUMBER: _ClassVar[int]
    HOST_SET_FIELD_NUMBER: _ClassVar[int]
    KV_EVENTS_FIELD_NUMBER: _ClassVar[int]
    origin: str
    seq: int
    sent_unix_ns: int
    decisions: _containers.RepeatedCompositeFieldContainer[Decision]
    finishes: _containers.RepeatedCompositeFieldContainer[Finish]
    loads: _containers.RepeatedCompositeFieldContainer[WorkerLoad]
    full_loads: bool
    goodbye: bool
    replay: bool
    host_set: str
    kv_events: _containers.RepeatedCompositeFieldContainer[KvEvents]
    def __init__(self, origin: _Optional[str] = ..., seq: _Optional[int] = ..., sent_unix_ns: _Optional[int] = ..., decisions: _Optional[_Iterable[_Union[Decision, _Mapping]]] = ..., finishes: _Optional[_Iterable[_Union[Finish, _Mapping]]] = ..., loads: _Optional[_Iterable[_Union[WorkerLoad, _Mapping]]] = ..., full_loads: _Optional[bool] = ..., goodbye: _Optional[bool] = ..., replay: _Optional[bool] = ..., host_set: _Optional[str] = ..., kv_events: _Optional[_Iterable[_Union[KvEvents, _Mapping]]] = ...) -> None: ...
