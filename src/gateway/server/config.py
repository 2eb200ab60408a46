"""The gateway's typed configuration: one dataclass per concern, composed here."""

from __future__ import annotations

from dataclasses import dataclass, field

from gateway.observability.tracing import TracingConfig
from gateway.parsers.config import ParserConfig
from gateway.pipeline.dispatch import DispatchConfig
from gateway.pipeline.encoder_build import DEFAULT_MAX_VOCABULARY_ENTRIES
from gateway.pipeline.engine import EngineConfig
from gateway.pipeline.limits import LimitsConfig
from gateway.pipeline.mcp_client import McpConfig
from gateway.pipeline.pd import PdConfig
from gateway.pipeline.resume import ResumeConfig
from gateway.pipeline.retry import RetryConfig
from gateway.pipeline.store.config import HistoryConfig
from gateway.policies.factory import PolicyConfig
from gateway.protocol.limits import DEFAULT_MAX_BODY_VALUES
from gateway.server.admission import AdmissionConfig
from gateway.server.http.limits import HttpLimitsConfig
from gateway.server.metrics_port import MetricsPortConfig
from gateway.server.process_config import ProcessConfig
from gateway.server.security import SecurityConfig
from gateway.server.tls import FrontTlsConfig
from gateway.settings import check_at_least, default_tokenizer_cache, option
from gateway.sync.config import SyncConfig
from gateway.workers.client import STREAM_TRANSPORTS
from gateway.workers.discovery.config import DiscoveryConfig
from gateway.workers.health import HealthConfig
from gateway.workers.load_monitor import LoadMonitorConfig
from gateway.workers.registry import MAX_DP_SIZE
from gateway.workers.tokenizer_fetch import DEFAULT_MAX_TOKENIZER_BYTES
from gateway.workers.watchdog import WatchdogConfig
from gateway.workers.zmq_kv_events import parse_sources


@dataclass
class ServerConfig:
    host: str = option("127.0.0.1", "address the HTTP server binds")
    port: int = option(30000, "HTTP port (0: pick a free one and print it in the ready line)")
    grpc_port: int | None = option(None, "gRPC port for the gateway's gRPC API and the SGLang pass-through (0: pick a free one; unset: no gRPC)")
    worker_urls: list[str] = option([], "regular workers: grpc(s)://host:port (SGLang --grpc-mode, vLLM or TensorRT-LLM gRPC) or http(s)://host:port (SGLang or vLLM HTTP server), the engine detected; --backend openai: OpenAI-compatible endpoints")
    model: str | None = option(None, "model name served to clients (default: what workers report)")
    tokenizer_path: str | None = option(None, "tokenizer folder or tokenizer.json (default: cache, then the worker, then the hub if --tokenizer-hub)")
    tokenizer_hub: bool = option(False, "when a worker cannot send its tokenizer, download the model it names from the Hugging Face hub (off: the worker would choose what the gateway fetches)")
    max_tokenizer_bytes: int = option(DEFAULT_MAX_TOKENIZER_BYTES, "largest tokenizer zip accepted from a worker's GetTokenizer, bytes (the download stops there)")
    max_vocabulary_entries: int = option(DEFAULT_MAX_VOCABULARY_ENTRIES, "largest tokenizer vocabulary loaded, entries (building it holds the event loop about a second per 400,000: a tokenizer past it is refused)")
    tokenizer_cache_dir: str = option(default_tokenizer_cache(), "where fetched tokenizers are kept (default: the user's cache folder, $XDG_CACHE_HOME or ~/.cache)")
    reply_token_reuse: bool = option(True, "tokenize a chat reply sent back in a later turn as the ids the model generated (matches the worker's prefix cache; docs/policies.md)")
    reply_cache_entries: int = option(4096, "replies remembered per model for --reply-token-reuse (least recently used go first)")
    reply_cache_bytes: int = option(64 * 1024 * 1024, "memory bound of those replies per model, bytes (text + 4 per token)")
    api_keys: list[str] = option([], "inference API keys clients must send as 'Authorization: Bearer KEY' (none: open)")
    max_body_bytes: int = option(32 * 1024 * 1024, "largest request body accepted, bytes")
    max_body_values: int = option(DEFAULT_MAX_BODY_VALUES, "most JSON values (token ids, messages, strings...) a request body may hold, counted as its commas, brackets and braces before it is parsed, and most token ids or messages one gRPC request may carry; more gets 413 (parsing holds the event loop about 40-170 ns per value; 0: no bound)")
    grpc_max_message_bytes: int = option(4 * 1024 * 1024, "gRPC door: largest request message accepted, bytes, and at most --max-body-bytes (grpcio's own default; a million tokens of text is about 4 MB): the message is parsed whole on the event loop before any check, up to about 40 ns a byte; more gets RESOURCE_EXHAUSTED")
    grpc_max_concurrent_streams: int = option(256, "gRPC door: most streams (calls) open at once on one client connection, advertised in HTTP/2 SETTINGS")
    grpc_max_connections: int = option(1024, "gRPC door: most client connections open at once; more are refused")
    worker_api_key: str | None = option(None, "bearer token the gateway sends to workers (an OpenAI backend's own API key with --backend openai)")
    worker_dp_size: int = option(0, "data-parallel ranks behind every worker URL, each routed to as its own target with its own cache (0: what each worker reports, dp_size; 1: one target per URL, the engine balances its ranks)")
    backend: str = option("auto", "what --worker-urls are (SMG's --backend): 'auto' (each worker's engine detected from what it answers), an engine named for all of them ('sglang', 'vllm', 'trtllm'), or 'openai' (external OpenAI-compatible endpoints: requests forwarded unchanged, routed on load only)", choices=["auto", "sglang", "vllm", "trtllm", "openai"])
    worker_startup_timeout_s: float = option(0.0, "at start, wait up to this long for listed workers that are not up yet before reporting ready, seconds (they are retried in the background either way; /readiness lists them)")
    probe_timeout_s: float = option(10.0, "time a new worker has to answer GetModelInfo/GetServerInfo, seconds")
    worker_stream_transport: str = option("h2", "how Generate streams reach workers: 'h2' (the gateway's own HTTP/2 reader: the tokens that arrived together are read and written together; docs/architecture.md) or 'grpcio' (grpc.aio, like every other worker call)", choices=list(STREAM_TRANSPORTS))
    kv_events: bool = option(False, "subscribe to workers' KV events and feed them to the cache_aware radix tree")
    kv_events_zmq: list[str] = option([], "with --kv-events: read a vLLM or SGLang worker's events from its own publishers, one per data-parallel rank, as WORKER_URL=ENDPOINT with ENDPOINT as in the engine's --kv-events-config (rank N at its port + N): tcp://*:PORT (vLLM binds: the gateway connects to the worker's host), tcp://ADDRESS:PORT (vLLM connects: the gateway binds that address of its own host, never a wildcard; with --processes N one process binds and hands the events to the others over the sync bus) or ipc://PATH (one rank); ENDPOINT,REPLAY also names vLLM's replay_endpoint (vLLM binds it: the gateway connects and asks it for the batches a gap lost before resetting the rank's share); 'auto' reads the publisher each worker not named reports in its server info (SGLang on both transports, vLLM's HTTP server in its development mode), a wildcard host there meaning the worker's host, from when it joins until it leaves; a publisher the gateway cannot use shows in GET /workers as kv_events_problem")
    log_level: str = option("info", "log level", choices=["debug", "info", "warning", "error"])
    log_json: bool = option(False, "structured logs: one JSON object per line, with the request id")
    access_log: bool = option(True, "one log line per HTTP request: endpoint, model, status, worker, latency, tokens")
    worker_drain_timeout_s: float = option(60.0, "DELETE /workers waits this long for the worker's in-flight requests, seconds")
    shutdown_grace_s: float = option(30.0, "on SIGTERM, in-flight requests get this long to finish before they are aborted, seconds")
    gc_young_threshold: int = option(50_000, "allocations between collections of the garbage collector's youngest generation (CPython's default, 700, makes the collector run hundreds of times a second while relaying; 0 keeps the default; the start-up heap is frozen either way)")

    def __post_init__(self) -> None:
        for name in ("port", "grpc_port"):
            value = getattr(self, name)
            if value is not None and not 0 <= value <= 65535:
                raise ValueError(f"--{name.replace('_', '-')} must be a port in 0-65535, got {value}")
        check_at_least(self, 1, "max_body_bytes", "grpc_max_message_bytes", "grpc_max_concurrent_streams", "grpc_max_connections",
                       "max_tokenizer_bytes", "max_vocabulary_entries", "reply_cache_entries", "reply_cache_bytes")
        check_at_least(self, 0, "max_body_values", "worker_startup_timeout_s", "probe_timeout_s", "worker_drain_timeout_s", "shutdown_grace_s",
                       "worker_dp_size")
        if self.worker_dp_size > MAX_DP_SIZE:
            raise ValueError(f"--worker-dp-size must be at most {MAX_DP_SIZE}, got {self.worker_dp_size}")
        parse_sources(self.kv_events_zmq)  # a bad entry is a start-up error, not a silent feed
        if self.kv_events_zmq and not self.kv_events:
            raise ValueError("--kv-events-zmq needs --kv-events (the feeds go to the cache_aware trees)")


@dataclass
class GatewayConfig:
    server: ServerConfig = field(default_factory=ServerConfig)
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    engine: EngineConfig = field(default_factory=EngineConfig)
    retry: RetryConfig = field(default_factory=RetryConfig)
    dispatch: DispatchConfig = field(default_factory=DispatchConfig)
    admission: AdmissionConfig = field(default_factory=AdmissionConfig)
    limits: LimitsConfig = field(default_factory=LimitsConfig)
    security: SecurityConfig = field(default_factory=SecurityConfig)
    health: HealthConfig = field(default_factory=HealthConfig)
    load_monitor: LoadMonitorConfig = field(default_factory=LoadMonitorConfig)
    pd: PdConfig = field(default_factory=PdConfig)
    processes: ProcessConfig = field(default_factory=ProcessConfig)
    sync: SyncConfig = field(default_factory=SyncConfig)
    parsers: ParserConfig = field(default_factory=ParserConfig)
    http: HttpLimitsConfig = field(default_factory=HttpLimitsConfig)
    metrics_port: MetricsPortConfig = field(default_factory=MetricsPortConfig)
    tls: FrontTlsConfig = field(default_factory=FrontTlsConfig)
    tracing: TracingConfig = field(default_factory=TracingConfig)
    watchdog: WatchdogConfig = field(default_factory=WatchdogConfig)
    resume: ResumeConfig = field(default_factory=ResumeConfig)
    discovery: DiscoveryConfig = field(default_factory=DiscoveryConfig)
    history: HistoryConfig = field(default_factory=HistoryConfig)
    mcp: McpConfig = field(default_factory=McpConfig)
