"""Embeddings through the gateway against vLLM's own pooling-side server code: the OpenAI
server's ``/v1/embeddings`` and the servicer's ``Embed``, over a pooling runner
(``--runner pooling``) whose stand-in engine answers each prompt with a vector of its ids.
vLLM's own ``/v1/embeddings``, given the same text, is the reference answer."""

from __future__ import annotations

import math
from typing import Any

import httpx
import openai
import pytest

from tests.interop_sglang.servers import Process, Recording
from tests.interop_vllm.servers import SERVED_MODEL

# The first test of a module starts its servers (two vLLMs and two gateways): minutes on a
# loaded two-core host.
pytestmark = pytest.mark.timeout(900)

TEXTS = ["The gateway routes on the tokens the worker caches.", "A second, different input."]


def _recording(proc: Process) -> Recording:
    rec: Recording = proc.extra["worker"].extra["recording"]
    rec.mark()
    return rec


def _client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key="interop", max_retries=0, timeout=60)


def _close(a: list[float], b: list[float]) -> bool:
    return len(a) == len(b) and all(math.isclose(x, y, rel_tol=1e-6, abs_tol=1e-7) for x, y in zip(a, b, strict=True))


def test_the_gateway_routes_embeddings_to_a_pooling_vllm(embed_front: Process, vllm_embed_http: Process) -> None:
    (worker,) = httpx.get(embed_front.extra["url"] + "/workers", timeout=10).json()["workers"]
    assert "embed" not in worker["lacks"] and worker["healthy"]
    # The runner as registered: the servicer's GetModelInfo says it; over HTTP, the routes
    # vLLM serves (no /v1/completions on a pooling server).
    assert worker["is_generation"] is False
    rec = _recording(embed_front)
    direct_rec: Recording = vllm_embed_http.extra["recording"]
    with _client(embed_front.extra["url"]) as gateway, _client(vllm_embed_http.extra["url"]) as direct:
        got = gateway.embeddings.create(model=SERVED_MODEL, input=TEXTS)
        ours = rec.wait("embed", 2)
        direct_rec.mark()  # the gateway's may have gone to this same server (HTTP)
        want = direct.embeddings.create(model=SERVED_MODEL, input=TEXTS)
        vllms = direct_rec.wait("embed", 2)
    assert [d.index for d in got.data] == [0, 1]
    for mine, theirs in zip(got.data, want.data, strict=True):
        assert _close(mine.embedding, theirs.embedding)
    assert not _close(got.data[0].embedding, got.data[1].embedding)
    assert got.usage.prompt_tokens == want.usage.prompt_tokens
    # The gateway sent vLLM's engine the ids vLLM's own server makes of the same texts.
    assert len(ours) == len(vllms) == 2
    assert sorted(r["prompt_token_ids"] for r in ours) == sorted(r["prompt_token_ids"] for r in vllms)


def test_a_generation_request_to_a_pooling_vllm_is_refused_not_hung(embed_front: Process) -> None:
    with _client(embed_front.extra["url"]) as gateway, pytest.raises(openai.APIStatusError) as caught:
        gateway.completions.create(model=SERVED_MODEL, prompt="no text from a pooling model", max_tokens=2)
    assert 400 <= caught.value.status_code < 600


def test_a_generation_vllm_refuses_embeddings(front: Process) -> None:
    """vLLM's OpenAI server has no embeddings route without a pooling runner (404: the
    gateway's 502 ``worker_unimplemented``, as for any engine that lacks a call); its
    servicer refuses the request itself (a client error)."""
    reply = httpx.post(
        front.extra["url"] + "/v1/embeddings", json={"model": SERVED_MODEL, "input": "x"}, timeout=60,
    )  # fmt: skip
    error: Any = reply.json()["error"]
    if front.extra["worker"].extra["url"].startswith("http"):
        assert reply.status_code == 502 and error["code"] == "worker_unimplemented"
    else:
        assert 400 <= reply.status_code < 500
