from gateway.proto import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class GenerateRequest(_message.Message):
    __slots__ = ("request_id", "tokenized", "sampling_config", "output_config", "max_tokens", "streaming", "guided_decoding", "embedding_bias", "cache_salt_id", "arrival_time", "stop", "stop_token_ids", "ignore_eos", "bad", "bad_token_ids", "include_stop_token_in_output")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    TOKENIZED_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_CONFIG_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_CONFIG_FIELD_NUMBER: _ClassVar[int]
    MAX_TOKENS_FIELD_NUMBER: _ClassVar[int]
    STREAMING_FIELD_NUMBER: _ClassVar[int]
    GUIDED_DECODING_FIELD_NUMBER: _ClassVar[int]
    EMBEDDING_BIAS_FIELD_NUMBER: _ClassVar[int]
    CACHE_SALT_ID_FIELD_NUMBER: _ClassVar[int]
    ARRIVAL_TIME_FIELD_NUMBER: _ClassVar[int]
    STOP_FIELD_NUMBER: _ClassVar[int]
    STOP_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    IGNORE_EOS_FIELD_NUMBER: _ClassVar[int]
    BAD_FIELD_NUMBER: _ClassVar[int]
    BAD_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    INCLUDE_STOP_TOKEN_IN_OUTPUT_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    tokenized: TokenizedInput
    sampling_config: SamplingConfig
    output_config: OutputConfig
    max_tokens: int
    streaming: bool
    guided_decoding: GuidedDecodingParams
    embedding_bias: _containers.RepeatedScalarFieldContainer[float]
    cache_salt_id: int
    arrival_time: float
    stop: _containers.RepeatedScalarFieldContainer[str]
    stop_token_ids: _containers.RepeatedScalarFieldContainer[int]
    ignore_eos: bool
    bad: _containers.RepeatedScalarFieldContainer[str]
    bad_token_ids: _containers.RepeatedScalarFieldContainer[int]
    include_stop_token_in_output: bool
    def __init__(self, request_id: _Optional[str] = ..., tokenized: _Optional[_Union[TokenizedInput, _Mapping]] = ..., sampling_config: _Optional[_Union[SamplingConfig, _Mapping]] = ..., output_config: _Optional[_Union[OutputConfig, _Mapping]] = ..., max_tokens: _Optional[int] = ..., streaming: _Optional[bool] = ..., guided_decoding: _Optional[_Union[GuidedDecodingParams, _Mapping]] = ..., embedding_bias: _Optional[_Iterable[float]] = ..., cache_salt_id: _Optional[int] = ..., arrival_time: _Optional[float] = ..., stop: _Optional[_Iterable[str]] = ..., stop_token_ids: _Optional[_Iterable[int]] = ..., ignore_eos: _Optional[bool] = ..., bad: _Optional[_Iterable[str]] = ..., bad_token_ids: _Optional[_Iterable[int]] = ..., include_stop_token_in_output: _Optional[bool] = ...) -> None: ...

class TokenizedInput(_message.Message):
    __slots__ = ("original_text", "input_token_ids", "query_token_ids")
    ORIGINAL_TEXT_FIELD_NUMBER: _ClassVar[int]
    INPUT_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    QUERY_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    original_text: str
    input_token_ids: _containers.RepeatedScalarFieldContainer[int]
    query_token_ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, original_text: _Optional[str] = ..., input_token_ids: _Optional[_Iterable[int]] = ..., query_token_ids: _Optional[_Iterable[int]] = ...) -> None: ...

class SamplingConfig(_message.Message):
    __slots__ = ("beam_width", "num_return_sequences", "top_k", "top_p", "top_p_min", "top_p_reset_ids", "top_p_decay", "seed", "temperature", "min_tokens", "beam_search_diversity_rate", "repetition_penalty", "presence_penalty", "frequency_penalty", "prompt_ignore_length", "length_penalty", "early_stopping", "no_repeat_ngram_size", "min_p", "beam_width_array")
    BEAM_WIDTH_FIELD_NUMBER: _ClassVar[int]
    NUM_RETURN_SEQUENCES_FIELD_NUMBER: _ClassVar[int]
    TOP_K_FIELD_NUMBER: _ClassVar[int]
    TOP_P_FIELD_NUMBER: _ClassVar[int]
    TOP_P_MIN_FIELD_NUMBER: _ClassVar[int]
    TOP_P_RESET_IDS_FIELD_NUMBER: _ClassVar[int]
    TOP_P_DECAY_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    MIN_TOKENS_FIELD_NUMBER: _ClassVar[int]
    BEAM_SEARCH_DIVERSITY_RATE_FIELD_NUMBER: _ClassVar[int]
    REPETITION_PENALTY_FIELD_NUMBER: _ClassVar[int]
    PRESENCE_PENALTY_FIELD_NUMBER: _ClassVar[int]
    FREQUENCY_PENALTY_FIELD_NUMBER: _ClassVar[int]
    PROMPT_IGNORE_LENGTH_FIELD_NUMBER: _ClassVar[int]
    LENGTH_PENALTY_FIELD_NUMBER: _ClassVar[int]
    EARLY_STOPPING_FIELD_NUMBER: _ClassVar[int]
    NO_REPEAT_NGRAM_SIZE_FIELD_NUMBER: _ClassVar[int]
    MIN_P_FIELD_NUMBER: _ClassVar[int]
    BEAM_WIDTH_ARRAY_FIELD_NUMBER: _ClassVar[int]
    beam_width: int
    num_return_sequences: int
    top_k: int
    top_p: float
    top_p_min: float
    top_p_reset_ids: int
    top_p_decay: float
    seed: int
    temperature: float
    min_tokens: int
    beam_search_diversity_rate: float
    repetition_penalty: float
    presence_penalty: float
    frequency_penalty: float
    prompt_ignore_length: int
    length_penalty: float
    early_stopping: int
    no_repeat_ngram_size: int
    min_p: float
    beam_width_array: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, beam_width: _Optional[int] = ..., num_return_sequences: _Optional[int] = ..., top_k: _Optional[int] = ..., top_p: _Optional[float] = ..., top_p_min: _Optional[float] = ..., top_p_reset_ids: _Optional[int] = ..., top_p_decay: _Optional[float] = ..., seed: _Optional[int] = ..., temperature: _Optional[float] = ..., min_tokens: _Optional[int] = ..., beam_search_diversity_rate: _Optional[float] = ..., repetition_penalty: _Optional[float] = ..., presence_penalty: _Optional[float] = ..., frequency_penalty: _Optional[float] = ..., prompt_ignore_length: _Optional[int] = ..., length_penalty: _Optional[float] = ..., early_stopping: _Optional[int] = ..., no_repeat_ngram_size: _Optional[int] = ..., min_p: _Optional[float] = ..., beam_width_array: _Optional[_Iterable[int]] = ...) -> None: ...

class OutputConfig(_message.Message):
    __slots__ = ("logprobs", "prompt_logprobs", "return_context_logits", "return_generation_logits", "exclude_input_from_output", "return_encoder_output", "return_perf_metrics")
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    PROMPT_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    RETURN_CONTEXT_LOGITS_FIELD_NUMBER: _ClassVar[int]
    RETURN_GENERATION_LOGITS_FIELD_NUMBER: _ClassVar[int]
    EXCLUDE_INPUT_FROM_OUTPUT_FIELD_NUMBER: _ClassVar[int]
    RETURN_ENCODER_OUTPUT_FIELD_NUMBER: _ClassVar[int]
    RETURN_PERF_METRICS_FIELD_NUMBER: _ClassVar[int]
    logprobs: int
    prompt_logprobs: int
    return_context_logits: bool
    return_generation_logits: bool
    exclude_input_from_output: bool
    return_encoder_output: bool
    return_perf_metrics: bool
    def __init__(self, logprobs: _Optional[int] = ..., prompt_logprobs: _Optional[int] = ..., return_context_logits: _Optional[bool] = ..., return_generation_logits: _Optional[bool] = ..., exclude_input_from_output: _Optional[bool] = ..., return_encoder_output: _Optional[bool] = ..., return_perf_metrics: _Optional[bool] = ...) -> None: ...

class GuidedDecodingParams(_message.Message):
    __slots__ = ("guide_type", "guide")
    class GuideType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        GUIDE_TYPE_UNSPECIFIED: _ClassVar[GuidedDecodingParams.GuideType]
        GUIDE_TYPE_JSON: _ClassVar[GuidedDecodingParams.GuideType]
        GUIDE_TYPE_JSON_SCHEMA: _ClassVar[GuidedDecodingParams.GuideType]
        GUIDE_TYPE_REGEX: _ClassVar[GuidedDecodingParams.GuideType]
        GUIDE_TYPE_EBNF_GRAMMAR: _ClassVar[GuidedDecodingParams.GuideType]
        GUIDE_TYPE_STRUCTURAL_TAG: _ClassVar[GuidedDecodingParams.GuideType]
    GUIDE_TYPE_UNSPECIFIED: GuidedDecodingParams.GuideType
    GUIDE_TYPE_JSON: GuidedDecodingParams.GuideType
    GUIDE_TYPE_JSON_SCHEMA: GuidedDecodingParams.GuideType
    GUIDE_TYPE_REGEX: GuidedDecodingParams.GuideType
    GUIDE_TYPE_EBNF_GRAMMAR: GuidedDecodingParams.GuideType
    GUIDE_TYPE_STRUCTURAL_TAG: GuidedDecodingParams.GuideType
    GUIDE_TYPE_FIELD_NUMBER: _ClassVar[int]
    GUIDE_FIELD_NUMBER: _ClassVar[int]
    guide_type: GuidedDecodingParams.GuideType
    guide: str
    def __init__(self, guide_type: _Optional[_Union[GuidedDecodingParams.GuideType, str]] = ..., guide: _Optional[str] = ...) -> None: ...

class GenerateResponse(_message.Message):
    __slots__ = ("request_id", "chunk", "complete")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    CHUNK_FIELD_NUMBER: _ClassVar[int]
    COMPLETE_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    chunk: GenerateStreamChunk
    complete: GenerateComplete
    def __init__(self, request_id: _Optional[str] = ..., chunk: _Optional[_Union[GenerateStreamChunk, _Mapping]] = ..., complete: _Optional[_Union[GenerateComplete, _Mapping]] = ...) -> None: ...

class GenerateStreamChunk(_message.Message):
    __slots__ = ("token_ids", "sequence_index", "prompt_tokens", "completion_tokens", "cached_tokens", "logprobs")
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    SEQUENCE_INDEX_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    COMPLETION_TOKENS_FIELD_NUMBER: _ClassVar[int]
    CACHED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    sequence_index: int
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    logprobs: _containers.RepeatedCompositeFieldContainer[TokenLogprob]
    def __init__(self, token_ids: _Optional[_Iterable[int]] = ..., sequence_index: _Optional[int] = ..., prompt_tokens: _Optional[int] = ..., completion_tokens: _Optional[int] = ..., cached_tokens: _Optional[int] = ..., logprobs: _Optional[_Iterable[_Union[TokenLogprob, _Mapping]]] = ...) -> None: ...

class GenerateComplete(_message.Message):
    __slots__ = ("output_token_ids", "sequence_index", "finish_reason", "matched_stop_str", "matched_token_id", "prompt_tokens", "completion_tokens", "cached_tokens", "logprobs", "prompt_logprobs", "spec_accepted_tokens", "spec_draft_tokens")
    OUTPUT_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    SEQUENCE_INDEX_FIELD_NUMBER: _ClassVar[int]
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    MATCHED_STOP_STR_FIELD_NUMBER: _ClassVar[int]
    MATCHED_TOKEN_ID_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    COMPLETION_TOKENS_FIELD_NUMBER: _ClassVar[int]
    CACHED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    PROMPT_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    SPEC_ACCEPTED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    SPEC_DRAFT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    output_token_ids: _containers.RepeatedScalarFieldContainer[int]
    sequence_index: int
    finish_reason: str
    matched_stop_str: str
    matched_token_id: int
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    logprobs: _containers.RepeatedCompositeFieldContainer[TokenLogprob]
    prompt_logprobs: _containers.RepeatedCompositeFieldContainer[TokenLogprob]
    spec_accepted_tokens: int
    spec_draft_tokens: int
    def __init__(self, output_token_ids: _Optional[_Iterable[int]] = ..., sequence_index: _Optional[int] = ..., finish_reason: _Optional[str] = ..., matched_stop_str: _Optional[str] = ..., matched_token_id: _Optional[int] = ..., prompt_tokens: _Optional[int] = ..., completion_tokens: _Optional[int] = ..., cached_tokens: _Optional[int] = ..., logprobs: _Optional[_Iterable[_Union[TokenLogprob, _Mapping]]] = ..., prompt_logprobs: _Optional[_Iterable[_Union[TokenLogprob, _Mapping]]] = ..., spec_accepted_tokens: _Optional[int] = ..., spec_draft_tokens: _Optional[int] = ...) -> None: ...

class TokenLogprob(_message.Message):
    __slots__ = ("token_id", "logprob", "top_logprobs")
    TOKEN_ID_FIELD_NUMBER: _ClassVar[int]
    LOGPROB_FIELD_NUMBER: _ClassVar[int]
    TOP_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    token_id: int
    logprob: float
    top_logprobs: _containers.RepeatedCompositeFieldContainer[TopLogprob]
    def __init__(self, token_id: _Optional[int] = ..., logprob: _Optional[float] = ..., top_logprobs: _Optional[_Iterable[_Union[TopLogprob, _Mapping]]] = ...) -> None: ...

class TopLogprob(_message.Message):
    __slots__ = ("token_id", "logprob")
    TOKEN_ID_FIELD_NUMBER: _ClassVar[int]
    LOGPROB_FIELD_NUMBER: _ClassVar[int]
    token_id: int
    logprob: float
    def __init__(self, token_id: _Optional[int] = ..., logprob: _Optional[float] = ...) -> None: ...

class EmbedRequest(_message.Message):
    __slots__ = ("request_id", "tokenized")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    TOKENIZED_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    tokenized: TokenizedInput
    def __init__(self, request_id: _Optional[str] = ..., tokenized: _Optional[_Union[TokenizedInput, _Mapping]] = ...) -> None: ...

class EmbedResponse(_message.Message):
    __slots__ = ("request_id", "embedding", "prompt_tokens")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    EMBEDDING_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    embedding: _containers.RepeatedScalarFieldContainer[float]
    prompt_tokens: int
    def __init__(self, request_id: _Optional[str] = ..., embedding: _Optional[_Iterable[float]] = ..., prompt_tokens: _Optional[int] = ...) -> None: ...

class HealthCheckRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class HealthCheckResponse(_message.Message):
    __slots__ = ("status",)
    STATUS_FIELD_NUMBER: _ClassVar[int]
    status: str
    def __init__(self, status: _Optional[str] = ...) -> None: ...

class AbortRequest(_message.Message):
    __slots__ = ("request_id",)
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    def __init__(self, request_id: _Optional[str] = ...) -> None: ...

class AbortResponse(_message.Message):
    __slots__ = ("success", "message")
    SUCCESS_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    success: bool
    message: str
    def __init__(self, success: _Optional[bool] = ..., message: _Optional[str] = ...) -> None: ...

class GetModelInfoRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetModelInfoResponse(_message.Message):
    __slots__ = ("model_id", "max_input_len", "max_seq_len", "max_batch_size", "vocab_size", "hidden_size", "num_layers", "num_heads", "supported_features")
    MODEL_ID_FIELD_NUMBER: _ClassVar[int]
    MAX_INPUT_LEN_FIELD_NUMBER: _ClassVar[int]
    MAX_SEQ_LEN_FIELD_NUMBER: _ClassVar[int]
    MAX_BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    VOCAB_SIZE_FIELD_NUMBER: _ClassVar[int]
    HIDDEN_SIZE_FIELD_NUMBER: _ClassVar[int]
    NUM_LAYERS_FIELD_NUMBER: _ClassVar[int]
    NUM_HEADS_FIELD_NUMBER: _ClassVar[int]
    SUPPORTED_FEATURES_FIELD_NUMBER: _ClassVar[int]
    model_id: str
    max_input_len: int
    max_seq_len: int
    max_batch_size: int
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    supported_features: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, model_id: _Optional[str] = ..., max_input_len: _Optional[int] = ..., max_seq_len: _Optional[int] = ..., max_batch_size: _Optional[int] = ..., vocab_size: _Optional[int] = ..., hidden_size: _Optional[int] = ..., num_layers: _Optional[int] = ..., num_heads: _Optional[int] = ..., supported_features: _Optional[_Iterable[str]] = ...) -> None: ...

class GetServerInfoRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetServerInfoResponse(_message.Message):
    __slots__ = ("version", "backend", "tensor_parallel_size", "pipeline_parallel_size", "context_parallel_size", "world_size")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    BACKEND_FIELD_NUMBER: _ClassVar[int]
    TENSOR_PARALLEL_SIZE_FIELD_NUMBER: _ClassVar[int]
    PIPELINE_PARALLEL_SIZE_FIELD_NUMBER: _ClassVar[int]
    CONTEXT_PARALLEL_SIZE_FIELD_NUMBER: _ClassVar[int]
    WORLD_SIZE_FIELD_NUMBER: _ClassVar[int]
    version: str
    backend: str
    tensor_parallel_size: int
    pipeline_parallel_size: int
    context_parallel_size: int
    world_size: int
    def __init__(self, version: _Optional[str] = ..., backend: _Optional[str] = ..., tensor_parallel_size: _Optional[int] = ..., pipeline_parallel_size: _Optional[int] = ..., context_parallel_size: _Optional[int] = ..., world_size: _Optional[int] = ...) -> None: ...
