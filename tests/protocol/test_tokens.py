"""``/tokenize`` and ``/detokenize`` bodies (protocol/tokens.py): text or messages, the
special-token default of each, and token ids that must be ids."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from gateway.protocol.errors import validation_error_to_gateway
from gateway.protocol.tokens import (
    DetokenizeRequest,
    DetokenizeResponse,
    TokenizeRequest,
    TokenizeResponse,
)

USER = [{"role": "user", "content": "hi"}]


def test_text_adds_special_tokens_and_messages_do_not_unless_asked() -> None:
    assert TokenizeRequest.model_validate({"prompt": "hi"}).special_tokens is True
    assert TokenizeRequest.model_validate({"messages": USER}).special_tokens is False
    assert TokenizeRequest.model_validate({"messages": USER, "add_special_tokens": True}).special_tokens is True
    assert TokenizeRequest.model_validate({"prompt": "hi", "add_special_tokens": False}).special_tokens is False


def test_messages_become_template_dicts() -> None:
    req = TokenizeRequest.model_validate({"messages": USER, "chat_template_kwargs": {"enable_thinking": False}})
    assert req.template_messages() == [{"role": "user", "content": "hi"}]
    assert req.add_generation_prompt and req.chat_template_kwargs == {"enable_thinking": False}
    assert TokenizeRequest.model_validate({"prompt": "x"}).template_messages() == []


@pytest.mark.parametrize(
    ("body", "param"),
    [({}, "prompt"), ({"prompt": "a", "messages": USER}, "prompt"), ({"messages": []}, "messages")],
)
def test_exactly_one_non_empty_input(body: dict[str, Any], param: str) -> None:
    with pytest.raises(ValidationError) as exc:
        TokenizeRequest.model_validate(body)
    assert validation_error_to_gateway(exc.value).param == param


def test_detokenize_takes_non_negative_ids_only() -> None:
    assert DetokenizeRequest.model_validate({"tokens": [0, 5]}).tokens == [0, 5]
    with pytest.raises(ValidationError) as exc:
        DetokenizeRequest.model_validate({"tokens": [1, -1]})
    err = validation_error_to_gateway(exc.value)
    assert err.param == "tokens" and "non-negative" in err.message


def test_responses_leave_out_an_unknown_context_length() -> None:
    assert TokenizeResponse(tokens=[1, 2], count=2).to_dict() == {"tokens": [1, 2], "count": 2}
    assert TokenizeResponse(tokens=[1], count=1, max_model_len=4096).to_dict()["max_model_len"] == 4096
    assert DetokenizeResponse(text="hi").to_dict() == {"text": "hi"}
