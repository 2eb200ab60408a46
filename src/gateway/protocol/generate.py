"""SGLang-native ``POST /generate``: request and response.

The request mirrors SGLang's ``GenerateReqInput`` for the fields the gateway can
honour; the response mirrors what SGLang returns (``text``, ``output_ids``,
``meta_info``), so existing SGLang clients work unchanged.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SkipValidation, field_validator, model_validator

from gateway.protocol import limits
from gateway.protocol.common import RequestModel, StopFieldsChecks, check_rid, stop_list
from gateway.protocol.completions import are_token_ids
from gateway.protocol.errors import ParamError


class GenerateSamplingParams(StopFieldsChecks):
    """SGLang's ``sampling_params`` dict; SGLang's defaults (``max_new_tokens`` 128)."""

    temperature: float = Field(default=1.0, ge=0.0, le=2.0)
    max_new_tokens: int | None = Field(default=128, ge=0, strict=True)
    min_new_tokens: int = Field(default=0, ge=0)
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = Field(default=None, max_length=limits.MAX_STOP_TOKEN_IDS)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    top_k: int = Field(default=-1, ge=-1)
    min_p: float = Field(default=0.0, ge=0.0, le=1.0)
    frequency_penalty: float = Field(default=0.0, ge=-2.0, le=2.0)
    presence_penalty: float = Field(default=0.0, ge=-2.0, le=2.0)
    repetition_penalty: float = Field(default=1.0, gt=0.0, le=2.0)
    n: int = Field(default=1, ge=1, le=limits.MAX_N, strict=True)
    regex: str | None = None
    json_schema: str | None = None
    ebnf: str | None = None
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    no_stop_trim: bool = False
    logit_bias: dict[str, float] | None = None
    sampling_seed: int | None = None

    @model_validator(mode="after")
    def _one_constraint(self) -> GenerateSamplingParams:
        given = [k for k in ("regex", "json_schema", "ebnf") if getattr(self, k) is not None]
        if len(given) > 1:
            raise ParamError(
                given[1], f"only one of regex, json_schema and ebnf may be set (got {given})"
            )
        return self

    def stop_strings(self) -> list[str]:
        return stop_list(self.stop)


class GenerateRequest(RequestModel):
    """``text`` or ``input_ids`` (one prompt or a batch), plus sampling and logprob options."""

    # Not in SGLang's body (one server, one model): names the model when several are served.
    model: str | None = None
    text: str | list[str] | None = None
    # Checked whole by ``_token_ids`` before pydantic: its own pass over the union would walk
    # a long prompt again, at several times the cost, on the event loop.
    input_ids: Annotated[list[int] | list[list[int]] | None, SkipValidation] = None
    sampling_params: GenerateSamplingParams | list[GenerateSamplingParams] = Field(
        default_factory=GenerateSamplingParams
    )
    stream: bool = False
    return_logprob: bool = False
    top_logprobs_num: int = Field(default=0, ge=0, le=limits.MAX_TOP_LOGPROBS)
    logprob_start_len: int = Field(default=-1, ge=-1)
    return_text_in_logprobs: bool = False
    return_hidden_states: bool = False
    rid: str | list[str] | None = None
    cache_salt: str | None = Field(default=None, min_length=1, max_length=256)  # vLLM's: no cache shared across salts
    priority: int | None = Field(default=None, ge=-(2**31), lt=2**31)  # SGLang's: admission order within the key

    @field_validator("rid")
    @classmethod
    def _rid(cls, value: str | list[str] | None) -> str | list[str] | None:
        return check_rid(value)

    @field_validator("input_ids", mode="before")
    @classmethod
    def _token_ids(cls, value: Any) -> Any:
        if value is None:
            return None
        if not isinstance(value, list) or not value:
            raise ValueError("input_ids must not be empty" if isinstance(value, list) else "input_ids must be a list")
        rows = value if isinstance(value[0], list) else [value]
        if not all(isinstance(row, list) and row and are_token_ids(row) for row in rows):
            raise ValueError("input_ids must be non-empty lists of non-negative token ids")
        return value

    @model_validator(mode="after")
    def _one_input(self) -> GenerateRequest:
        if (self.text is None) == (self.input_ids is None):
            raise ParamError("text", "exactly one of text and input_ids must be given")
        if isinstance(self.text, list) and not self.text:
            raise ParamError("text", "text must not be an empty list")
        size = self.batch_size
        if isinstance(self.sampling_params, list) and len(self.sampling_params) != size:
            raise ParamError(
                "sampling_params",
                f"sampling_params has {len(self.sampling_params)} entries for {size} prompts",
            )
        if isinstance(self.rid, list) and len(self.rid) != size:
            raise ParamError("rid", f"rid has {len(self.rid)} entries for {size} prompts")
        return self

    @property
    def is_batch(self) -> bool:
        """True when the client sent a list of prompts (the response is then a list)."""
        if self.text is not None:
            return isinstance(self.text, list)
        return bool(self.input_ids) and isinstance(self.input_ids[0], list)  # type: ignore[index]

    @property
    def batch_size(self) -> int:
        return len(self.prompts())

    def prompts(self) -> list[str] | list[list[int]]:
        """One text or one token-id list per prompt."""
        if self.text is not None:
            return [self.text] if isinstance(self.text, str) else list(self.text)
        ids = self.input_ids or []
        if ids and isinstance(ids[0], list):
            return [list(row) for row in ids]  # type: ignore[union-attr]
        return [list(ids)]  # type: ignore[arg-type]

    def params_for(self, index: int) -> GenerateSamplingParams:
        """Sampling params of prompt ``index`` (a single dict applies to all)."""
        if isinstance(self.sampling_params, list):
            return self.sampling_params[index]
        return self.sampling_params

    def rid_for(self, index: int) -> str | None:
        if isinstance(self.rid, list):
            return self.rid[index]
        if self.rid is not None and self.is_batch:
            return f"{self.rid}-{index}"
        return self.rid


class GenerateFinishReason(BaseModel):
    """``meta_info.finish_reason`` as SGLang reports it.

    ``stop``: ``matched`` is the stop token id (int) or stop string that ended
    the text (absent for EOS without a listed stop); ``length``: ``length`` is the
    completion token count; ``abort``: ``message`` says why.
    """

    model_config = ConfigDict(extra="allow")

    type: Literal["stop", "length", "abort"]
    matched: int | str | None = None
    length: int | None = None
    message: str | None = None


class GenerateMetaInfo(BaseModel):
    """``meta_info``: ids, counts and (when asked) logprobs as SGLang lays them out.

    Logprob lists use SGLang's row shape ``[logprob, token_id, text_or_null]``;
    top-logprob lists hold one such list of rows per position.
    """

    model_config = ConfigDict(extra="allow")

    id: str
    finish_reason: GenerateFinishReason | None = None
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int = 0
    e2e_latency: float | None = None
    input_token_logprobs: list[list[Any]] | None = None
    output_token_logprobs: list[list[Any]] | None = None
    input_top_logprobs: list[list[list[Any]] | None] | None = None
    output_top_logprobs: list[list[list[Any]] | None] | None = None


class GenerateResponse(BaseModel):
    """One prompt's result (a batch request answers with a list of these)."""

    text: str
    output_ids: list[int]
    meta_info: GenerateMetaInfo
    index: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return self.model_dump(exclude_none=True)


def generate_finish_reason(
    reason: str | None,
    *,
    completion_tokens: int,
    matched_token_id: int | None = None,
    matched_stop_str: str | None = None,
    message: str | None = None,
) -> GenerateFinishReason | None:
    """The SGLang-native finish_reason object from a worker's finish string and match."""
    if reason is None or reason == "":
        return None
    if reason == "length":
        return GenerateFinishReason(type="length", length=completion_tokens)
    if reason == "abort":
        return GenerateFinishReason(type="abort", message=message)
    matched: int | str | None = matched_stop_str if matched_stop_str else matched_token_id
    return GenerateFinishReason(type="stop", matched=matched)
