"""A request after templating and tokenization: everything dispatch needs."""

from __future__ import annotations

from dataclasses import dataclass, field

from gateway.protocol.sampling import SamplingOptions
from gateway.tokenization import StopPlan, Tokenizer


@dataclass(slots=True)
class PreparedRequest:
    request_id: str
    model: str
    prompt_ids: list[int]
    sampling: SamplingOptions
    stop_plan: StopPlan
    tokenizer: Tokenizer
    stream: bool = False
    prompt_text: str = ""  # sent to the worker as original_text, for its logs
    routing_key: str | None = None
    target_worker: str | None = None
    require_reasoning: bool = False
    output_room: int | None = None  # what the context leaves after the prompt, when known
    timings: dict[str, float] = field(default_factory=dict)
