"""Inspecting one prompt (endpoints/inspect.py): offline against a worker list, and live
against a gateway's engine, router and policy, tokenized as the inference endpoints do."""

from __future__ import annotations

from functools import cache

import pytest

from gateway.endpoints.inspect import (
    Inspector,
    check_ids,
    hash_params,
    inspect_offline,
    render_prompt,
    worker_views,
)
from gateway.policies.factory import PolicyConfig
from gateway.policies.prefix_hash import PrefixHashPolicy
from gateway.protocol.errors import InvalidRequestError
from gateway.protocol.inspect import InspectRequest
from gateway.server.config import GatewayConfig
from gateway.tokenization import Tokenizer
from tests.server.http.gateway_app import gateway
from tests.tokenization.helpers import qwen_files


@cache
def _qwen() -> Tokenizer:
    return Tokenizer.from_path(qwen_files(), name="Qwen/Qwen3-0.6B")


def _req(**body: object) -> InspectRequest:
    return InspectRequest.model_validate(body)


def test_hash_parameters_come_from_the_request_the_live_policy_or_the_config() -> None:
    config = PolicyConfig(hash_block_size=16, hash_depth_tokens=256)
    assert hash_params(None, config, _req(text="x")) == (16, 256)
    live = PrefixHashPolicy(block_size=32, depth_tokens=512)
    assert hash_params(live, config, _req(text="x")) == (32, 512)
    assert hash_params(live, config, _req(text="x", block_size=8)) == (8, 512)


def test_prompts_render_as_the_inference_endpoints_render_them() -> None:
    tok = _qwen()
    assert render_prompt(tok, _req(input_ids=[1, 2])) == (None, [1, 2])
    with pytest.raises(InvalidRequestError, match="input_ids must be in"):
        check_ids([tok.vocab_size], tok)
    text, ids = render_prompt(tok, _req(messages=[{"role": "user", "content": "hi"}]))
    assert text is not None and "<|im_start|>user\nhi<|im_end|>" in text and ids == tok.encode(text, False)
    assert render_prompt(tok, _req(text="hello"))[1] == tok.encode("hello", True)


def test_worker_urls_become_idle_views() -> None:
    views = worker_views(["grpc://10.0.0.1:30000", "10.0.0.2:30000"])
    assert [(v.worker_id, v.url, v.in_flight) for v in views] == [
        ("10.0.0.1:30000", "grpc://10.0.0.1:30000", 0), ("10.0.0.2:30000", "grpc://10.0.0.2:30000", 0)]
    with pytest.raises(InvalidRequestError) as err:
        worker_views(["ftp://x:1"])
    assert err.value.param == "workers"


def test_offline_inspection_names_the_ring_owner_without_a_tree() -> None:
    tok = _qwen()
    config = PolicyConfig(policy="prefix_hash")
    result = inspect_offline(tok, _req(text="The quick brown fox " * 20), ["grpc://a:1", "grpc://b:1"], config)
    d = result.to_dict()
    assert d["source"] == "offline" and d["token_count"] > 0 and d["ring"]["owner"] in {"a:1", "b:1"}
    assert any("offline" in note for note in d["notes"])
    bare = inspect_offline(tok, _req(text="hi", include_tokens=False), [], config).to_dict()
    assert bare["tokens"] == [] and any("no workers given" in n for n in bare["notes"])


async def test_live_inspection_uses_the_gateways_tree() -> None:
    async with gateway(GatewayConfig()) as (state, _):
        await state.add_worker("grpc://w1:1")
        inspector = Inspector(state.engine, state.config.policy)
        result = (await inspector.inspect(_req(messages=[{"role": "user", "content": "hello"}]))).to_dict()
        assert result["source"] == "gateway" and result["model"] == "fake-model"
        assert [w["worker_id"] for w in result["workers"]] == ["w1:1"] and result["tree"]
        assert result["decision"]["choice"] == "w1:1"
        none = (await inspector.inspect(_req(text="hi", pool="decode"))).to_dict()
        assert any("no decode worker" in n for n in none["notes"])
        with pytest.raises(InvalidRequestError, match="empty"):
            await inspector.inspect(_req(text=""))
