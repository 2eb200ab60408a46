"""One normalized ``SamplingOptions`` from three request shapes (protocol/sampling.py):
defaults settled once (a chat's model defaults filled as it is built), constraints exclusive
(vLLM's ``structured_outputs`` among them), logprob options per API."""

from __future__ import annotations

import dataclasses
import itertools
import json
import re
from typing import Any

import pytest
from pydantic import ValidationError

from gateway.pipeline.model_facts import apply_model_defaults
from gateway.protocol.chat import ChatCompletionRequest
from gateway.protocol.completions import CompletionRequest
from gateway.protocol.errors import InvalidRequestError, validation_error_to_gateway
from gateway.protocol.generate import GenerateRequest
from gateway.protocol.sampling import (
    JSON_OBJECT_SCHEMA,
    MODEL_DEFAULT_KEYS,
    Constraint,
    SamplingOptions,
    model_default_values,
    sampling_from_chat,
    sampling_from_completion,
    sampling_from_generate,
)

USER = [{"role": "user", "content": "hi"}]


def _chat(**fields: Any) -> SamplingOptions:
    return sampling_from_chat(ChatCompletionRequest.model_validate({"messages": USER, **fields}))


def _completion(**fields: Any) -> SamplingOptions:
    return sampling_from_completion(CompletionRequest.model_validate({"prompt": "x", **fields}))


def test_chat_defaults_and_what_the_model_may_fill() -> None:
    s = _chat()
    assert (s.temperature, s.top_p, s.top_k, s.repetition_penalty, s.max_new_tokens) == (1.0, 1.0, -1, 1.0, None)
    assert s.unset == frozenset(MODEL_DEFAULT_KEYS)
    s = _chat(temperature=0.0, top_k=0, stop="END", max_completion_tokens=5, seed=3, logit_bias={"5": 1})
    assert (s.temperature, s.top_k, s.stop, s.max_new_tokens, s.seed) == (0.0, -1, ("END",), 5, 3)  # top_k 0 is "off"
    assert "temperature" not in s.unset and "top_k" not in s.unset and "top_p" in s.unset
    assert dict(s.logit_bias) == {"5": 1.0}


def test_chat_logprobs_and_response_formats() -> None:
    assert (_chat(logprobs=True, top_logprobs=3).top_logprobs, _chat().top_logprobs) == (3, 0)
    assert _chat(response_format={"type": "text"}).constraint is None
    assert _chat(response_format={"type": "json_object"}).constraint == Constraint("json_schema", JSON_OBJECT_SCHEMA)
    schema = {"type": "object", "properties": {"é": {"type": "string"}}}
    c = _chat(response_format={"type": "json_schema", "json_schema": {"schema": schema}}).constraint
    assert c is not None and c.kind == "json_schema" and json.loads(c.value) == schema and "é" in c.value
    with pytest.raises(InvalidRequestError, match="regex, response_format") as err:
        _chat(regex="a+", response_format={"type": "json_object"})
    assert err.value.param == "response_format"


def test_completion_defaults_logprobs_and_echo() -> None:
    s = _completion()
    assert (s.max_new_tokens, s.logprobs, s.logprob_start_len, s.unset) == (16, False, -1, frozenset())
    s = _completion(logprobs=2, echo=True)
    assert (s.logprobs, s.top_logprobs, s.logprob_start_len) == (True, 2, 0)  # echo: prompt logprobs too
    assert _completion(logprobs=0).logprobs is True
    assert _completion(json_schema='{"type": "object"}').constraint == Constraint("json_schema", '{"type": "object"}')


def test_generate_keeps_sglangs_fields_per_prompt() -> None:
    req = GenerateRequest.model_validate({
        "text": ["a", "b"], "return_logprob": True, "top_logprobs_num": 2, "logprob_start_len": 1,
        "sampling_params": [{"top_k": 0, "sampling_seed": 9, "ebnf": "root ::= x"}, {"max_new_tokens": 3, "stop": "S"}],
    })
    first, second = sampling_from_generate(req, 0), sampling_from_generate(req, 1)
    assert (first.top_k, first.seed, first.constraint) == (-1, 9, Constraint("ebnf", "root ::= x"))
    assert (second.max_new_tokens, second.stop, second.top_logprobs, second.logprob_start_len) == (3, ("S",), 2, 1)
    plain = sampling_from_generate(GenerateRequest.model_validate({"text": "a", "top_logprobs_num": 2}))
    assert (plain.logprobs, plain.top_logprobs, plain.logprob_start_len, plain.max_new_tokens) == (False, 0, -1, 128)


def test_a_second_constraint_is_a_client_error() -> None:
    s = SamplingOptions()
    assert s.with_constraint(None) is s
    constrained = s.with_constraint(("regex", "a+"))
    assert constrained.constraint == Constraint("regex", "a+") and s.constraint is None
    with pytest.raises(InvalidRequestError, match="already constrains the output with regex") as err:
        constrained.with_constraint(("json_schema", "{}"))
    assert err.value.param == "tool_choice"


CHOSEN = {"temperature": 0.3, "top_p": 0.5, "top_k": 7, "min_p": 0.1, "repetition_penalty": 1.2}
DEFAULTS = [{}, {"temperature": 0.6, "top_p": 0.95, "top_k": 20}, {"top_k": 0, "min_p": 0.05, "repetition_penalty": 1.1}]


def test_defaults_filled_while_building_equal_defaults_filled_after() -> None:
    for given in itertools.product((False, True), repeat=len(MODEL_DEFAULT_KEYS)):
        knobs = {k: CHOSEN[k] for k, chosen in zip(MODEL_DEFAULT_KEYS, given, strict=True) if chosen}
        req = ChatCompletionRequest(model="m", messages=[{"role": "user", "content": "hi"}], **knobs)
        plain = sampling_from_chat(req)
        assert plain.unset == frozenset(MODEL_DEFAULT_KEYS) - knobs.keys()
        for defaults in DEFAULTS:
            after = apply_model_defaults(plain, defaults)
            built = sampling_from_chat(req, defaults)
            filled = model_default_values(plain.unset, defaults)
            assert built == dataclasses.replace(after, unset=plain.unset - filled.keys())
            assert apply_model_defaults(built, defaults) == built  # nothing left to fill
            assert sampling_from_chat(req, None) == plain


def test_a_zero_top_k_default_means_off() -> None:
    req = ChatCompletionRequest(model="m", messages=[{"role": "user", "content": "hi"}])
    assert sampling_from_chat(req, {"top_k": 0}).top_k == -1
    assert model_default_values(frozenset({"top_k", "top_p"}), {"top_k": 5.0}) == {"top_k": 5}


def test_vllms_structured_outputs_become_the_gateways_constraint() -> None:
    """A vLLM client names its constraint in ``structured_outputs``: applied, not dropped."""
    assert _chat(structured_outputs={"regex": "a+"}).constraint == Constraint("regex", "a+")
    assert _completion(structured_outputs={"grammar": "root ::= x"}).constraint == Constraint("ebnf", "root ::= x")
    schema = {"type": "object", "properties": {"é": {"type": "string"}}}
    c = _chat(structured_outputs={"json": schema}).constraint
    assert c is not None and c.kind == "json_schema" and json.loads(c.value) == schema and "é" in c.value
    assert _completion(structured_outputs={"json": '{"type": "string"}'}).constraint == Constraint(
        "json_schema", '{"type": "string"}'
    )
    assert _chat(structured_outputs={"json_object": True}).constraint == Constraint("json_schema", JSON_OBJECT_SCHEMA)
    assert _chat(structured_outputs={"json_object": False}).constraint is None
    c = _completion(structured_outputs={"choice": ["yes", "no (maybe)", "a.b"]}).constraint
    assert c == Constraint("regex", r"(yes|no \(maybe\)|a\.b)")
    assert re.fullmatch(c.value, "no (maybe)") and not re.fullmatch(c.value, "aXb")
    with pytest.raises(InvalidRequestError, match="regex, structured_outputs") as err:
        _completion(regex="a+", structured_outputs={"regex": "b+"})
    assert err.value.param == "structured_outputs"


@pytest.mark.parametrize(
    ("structured", "param", "message"),
    [
        ({"regex": "a+", "choice": ["x"]}, "structured_outputs.choice", "one constraint, got: regex, choice"),
        ({"regex": "("}, "structured_outputs.regex", "does not compile"),
        ({"choice": []}, "structured_outputs.choice", "at least 1"),
        ({"json": "[1"}, "structured_outputs", "not valid JSON"),
        ({"structural_tag": "{}"}, "structured_outputs.structural_tag", "not supported"),
        ({"regex": "a", "disable_any_whitespace": True}, "structured_outputs.disable_any_whitespace", "not supported"),
    ],
)
def test_a_structured_outputs_the_gateway_cannot_apply_is_a_client_error(
    structured: dict[str, Any], param: str, message: str
) -> None:
    with pytest.raises(ValidationError) as exc:
        ChatCompletionRequest.model_validate({"messages": USER, "structured_outputs": structured})
    err = validation_error_to_gateway(exc.value)
    assert err.param == param and message in err.message, (err.param, err.message)
