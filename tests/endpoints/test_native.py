"""SGLang's /generate, embeddings and tokenize/detokenize (endpoints/native.py), on a
gateway whose worker is in memory: one result per prompt and sample, SGLang's meta_info,
streams in SGLang's cumulative shape, and the gateway's own tokenizer."""

from __future__ import annotations

import json

from gateway.server.config import GatewayConfig
from tests.fake_transport import chunk, complete
from tests.server.http.gateway_app import add_model_worker, gateway


async def test_generate_one_prompt_and_a_batch() -> None:
    async with gateway(GatewayConfig()) as (state, client):
        await state.add_worker("grpc://w1:1")
        worker = state.transports["grpc://w1:1"]  # type: ignore[attr-defined]
        worker.script(complete([9707, 1879], finish="length", prompt=3, cached=1))
        r = await client.post("/generate", json={"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 2}, "rid": "g1"})
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["output_ids"] == [9707, 1879] and body["text"].startswith("Hello")
        meta = body["meta_info"]
        assert meta["id"] == "g1" and meta["finish_reason"] == {"type": "length", "length": 2}
        assert (meta["prompt_tokens"], meta["completion_tokens"], meta["cached_tokens"]) == (3, 2, 1)
        sent = worker.requests[-1]
        assert list(sent.tokenized.input_ids) == [1, 2, 3] and sent.sampling_params.max_new_tokens == 2
        batch = await client.post("/generate", json={"text": ["a", "b"], "sampling_params": {"max_new_tokens": 1}})
        assert batch.status_code == 200 and isinstance(batch.json(), list) and len(batch.json()) == 2
        assert len(worker.requests) == 3  # one worker request per prompt


async def test_generate_names_its_model_when_several_are_served() -> None:
    async with gateway(GatewayConfig()) as (state, client):
        await state.add_worker("grpc://w1:1")
        other = await add_model_worker(state, "grpc://w2:1", "other-model")
        fake = state.transports["grpc://w1:1"]  # type: ignore[attr-defined]
        other.script(complete([9707], finish="length", prompt=3))
        r = await client.post("/generate", json={"model": "other-model", "input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 1}})
        assert r.status_code == 200, r.text
        assert r.json()["output_ids"] == [9707] and len(other.requests) == 1 and not fake.requests
        fake.script(complete([1879], finish="length", prompt=1))
        r = await client.post("/generate", json={"model": "fake-model", "text": "hi", "sampling_params": {"max_new_tokens": 1}})
        assert r.status_code == 200 and len(fake.requests) == 1 and len(other.requests) == 1
        # Without a model, or with one nobody serves: the OpenAI error shape, nothing sent.
        for body in ({"input_ids": [1, 2]}, {"model": "nope", "input_ids": [1, 2]}):
            missing = await client.post("/generate", json=body)
            assert missing.status_code == 404, missing.text
            assert missing.json()["error"]["code"] == "model_not_found"
        bad = await client.post("/generate", json={"model": 7, "input_ids": [1, 2]})
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "model"
        assert len(fake.requests) == 1 and len(other.requests) == 1


async def test_generate_streams_sglang_chunks() -> None:
    async with gateway(GatewayConfig()) as (state, client):
        await state.add_worker("grpc://w1:1")
        state.transports["grpc://w1:1"].script(chunk([9707]), chunk([1879]), complete([], finish="stop"))  # type: ignore[attr-defined]
        r = await client.post("/generate", json={"text": "hi", "stream": True})
        events = [line[6:] for line in r.text.split("\n\n") if line.startswith("data: ")]
        assert events[-1] == "[DONE]"
        chunks = [json.loads(e) for e in events[:-1]]
        assert chunks[-1]["meta_info"]["finish_reason"]["type"] == "stop"
        # SGLang's stream is cumulative: each chunk carries the text and ids so far
        assert [c["text"] for c in chunks] == ["Hello", "Hello world", "Hello world"]
        assert [c["output_ids"] for c in chunks] == [[9707], [9707, 1879], [9707, 1879]]


async def test_embeddings_tokenize_and_detokenize() -> None:
    async with gateway(GatewayConfig()) as (state, client):
        await state.add_worker("grpc://w1:1")
        emb = (await client.post("/v1/embeddings", json={"input": ["a b", "c"]})).json()
        assert [d["index"] for d in emb["data"]] == [0, 1] and emb["data"][0]["embedding"] == [0.5, 0.25]
        assert emb["usage"]["prompt_tokens"] == emb["usage"]["total_tokens"] > 0
        tok = (await client.post("/v1/tokenize", json={"prompt": "Hello world"})).json()
        entry = state.catalog.get(None)
        assert tok["tokens"] == entry.tokenizer.encode("Hello world", True) and tok["count"] == len(tok["tokens"])
        back = (await client.post("/v1/detokenize", json={"tokens": tok["tokens"]})).json()
        assert back["text"] == "Hello world"
        chat = (await client.post("/v1/tokenize", json={"messages": [{"role": "user", "content": "hi"}]})).json()
        assert entry.tokenizer.convert_ids_to_tokens(chat["tokens"][:1]) == ["<|im_start|>"]  # the chat template
        bad = await client.post("/v1/detokenize", json={"tokens": [10**9]})
        assert bad.status_code == 400
