"""What a worker receives from the gateway is what SGLang's own server would hand its
scheduler for the same OpenAI request: the model's sampling defaults where the request
leaves them out, no seed smuggled in custom_params, the model's real context limits
(refused before any worker is touched), and usage counts a reply's reasoning honestly.

The simulated workers answer like SGLang's servicer (placeholders in GetModelInfo, the
KV pool as ``max_context_length``, the model's files in the tokenizer zip).
"""

from __future__ import annotations

import asyncio

import openai
import pytest

from .conftest import Stack

QWEN3_DEFAULTS = {"temperature": 0.6, "top_p": 0.95, "top_k": 20}
HI = [{"role": "user", "content": "hi"}]


def sent_to_workers(stack: Stack) -> int:
    return sum(w.counters.requests for w in stack.fleet.workers)


@pytest.mark.stack(workers=1)
async def test_chat_takes_the_models_sampling_defaults_for_what_it_omits(stack: Stack) -> None:
    """SGLang's OpenAI server: request value, else the model's generation config, else
    OpenAI's; the worker itself applies none of them."""
    (worker,) = stack.fleet.workers
    await stack.client.chat.completions.create(model=stack.model, messages=HI, max_tokens=4)
    sp = worker.received[-1].sampling_params
    assert (round(sp.temperature, 4), round(sp.top_p, 4), sp.top_k) == (0.6, 0.95, 20)
    assert sp.min_p == 0.0 and sp.repetition_penalty == 1.0  # the model sets none: OpenAI's
    await stack.client.chat.completions.create(model=stack.model, messages=HI, max_tokens=4, temperature=0, top_p=0.5)
    sp = worker.received[-1].sampling_params
    assert (sp.temperature, sp.top_p, sp.top_k) == (0.0, 0.5, 20)  # a value sent, 0 included, wins


@pytest.mark.stack(workers=1)
async def test_completions_keep_openais_defaults(stack: Stack) -> None:
    """SGLang's /v1/completions does not apply the model's defaults; neither does the gateway."""
    (worker,) = stack.fleet.workers
    await stack.client.completions.create(model=stack.model, prompt="hi", max_tokens=4)
    sp = worker.received[-1].sampling_params
    assert (sp.temperature, sp.top_p, sp.top_k) == (1.0, 1.0, -1)


@pytest.mark.stack(workers=1, sim={"sampling_defaults": ""})
async def test_a_model_without_defaults_gets_openais(stack: Stack) -> None:
    (worker,) = stack.fleet.workers
    await stack.client.chat.completions.create(model=stack.model, messages=HI, max_tokens=4)
    sp = worker.received[-1].sampling_params
    assert (sp.temperature, sp.top_p, sp.top_k) == (1.0, 1.0, -1)


@pytest.mark.stack(workers=1)
async def test_seed_is_not_sent_as_a_custom_param(stack: Stack) -> None:
    """custom_params reach custom logit processors only; the wire has no seed field."""
    (worker,) = stack.fleet.workers
    await stack.client.chat.completions.create(model=stack.model, messages=HI, max_tokens=4, seed=7)
    assert not worker.received[-1].sampling_params.HasField("custom_params")


@pytest.mark.stack(workers=2, sim={"context_length": 4096, "kv_capacity_tokens": 65536})
async def test_the_models_context_is_advertised_and_enforced_before_any_worker(stack: Stack) -> None:
    """GetModelInfo's max_context_length is the KV pool (65,536 here); the model's context
    is config.json's 4,096, and prompts of 4,096 - 1 - 5 tokens or more are refused."""
    models = (await stack.http.get("/v1/models")).json()["data"]
    assert models[0]["max_model_len"] == 4096
    before = sent_to_workers(stack)
    ids = [9707] * 4090  # one token each ("Hello"): the workers' limit is 4,090
    with pytest.raises(openai.BadRequestError) as err:
        await stack.client.completions.create(model=stack.model, prompt=ids, max_tokens=1)
    assert err.value.code == "context_length_exceeded" and "4089" in err.value.message
    with pytest.raises(openai.BadRequestError) as err:  # prompt + max_tokens reaching the context
        await stack.client.completions.create(model=stack.model, prompt=ids[:3000], max_tokens=1096)
    assert err.value.code == "context_length_exceeded"
    assert sent_to_workers(stack) == before, "a refused prompt never reaches a worker"
    done = await stack.client.completions.create(model=stack.model, prompt=ids[:4089], max_tokens=1)
    assert done.usage.prompt_tokens == 4089


@pytest.mark.stack(workers=1)
async def test_workers_and_models_say_where_each_fact_comes_from(stack: Stack) -> None:
    body = (await stack.http.get("/workers")).json()
    (worker,) = body["workers"]
    assert worker["reported"]["vocab_size"] == 128256 and worker["reported"]["eos_token_ids"] == []
    assert worker["page_size"] == 16 and worker["page_size_source"] == "server_args.page_size"
    assert worker["max_req_input_len"] == 32768 - 1 - 5
    (model,) = body["models"]
    assert model["context_length"] == {"value": 32768, "source": "config.json"}
    assert model["default_sampling"]["value"] == QWEN3_DEFAULTS
    assert model["default_sampling"]["source"] == "GetModelInfo default_sampling_params_json"
    assert model["vocab_size"]["value"] == 151669 and model["vocab_size"]["source"] == "tokenizer.json"
    assert model["eos_token_ids"]["value"] == [151643, 151645]  # from the model's files, not the worker


@pytest.mark.stack(workers=1, sim={"report_page_size": False}, policy="cache_aware",
                   server={"kv_events": True})
async def test_an_unreported_page_size_is_learned_from_the_kv_events(stack: Stack) -> None:
    """SGLang leaves page_size null unless the operator sets it: 1 is assumed and flagged
    until the worker's KV events show its block size."""
    (worker,) = stack.state.registry.all()
    assert worker.info.page_size_source.startswith("unknown") or worker.info.page_size == 16
    await stack.client.completions.create(model=stack.model, prompt="a fairly long prompt " * 8, max_tokens=2)
    for _ in range(200):
        if worker.info.page_size_source == "kv_events":
            break
        await asyncio.sleep(0.02)
    assert (worker.info.page_size, worker.info.page_size_source) == (16, "kv_events")
    assert worker.view().page_size == 16


def _reply(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": f"please answer <<sim-reply>>{text}<</sim-reply>>"}]


@pytest.mark.stack(workers=1)
async def test_reasoning_tokens_count_only_the_think_block(stack: Stack) -> None:
    plain = await stack.client.chat.completions.create(model=stack.model, messages=_reply("Paris is the capital."), max_tokens=40)
    assert plain.choices[0].message.content == "Paris is the capital."
    assert plain.usage.completion_tokens > 3 and plain.usage.completion_tokens_details.reasoning_tokens == 0
    thought = await stack.client.chat.completions.create(
        model=stack.model, messages=_reply("<think>Short.</think>Paris."), max_tokens=40,
    )
    tokenizer = stack.state.catalog.get(stack.model).tokenizer
    block = len(tokenizer.encode("<think>Short.</think>", add_special_tokens=False))
    assert thought.usage.completion_tokens_details.reasoning_tokens == block
    stream = await stack.client.chat.completions.create(
        model=stack.model, messages=_reply("Paris is the capital."), max_tokens=40, stream=True,
        stream_options={"include_usage": True},
    )
    usage = [c.usage async for c in stream if c.usage]
    assert usage[-1].completion_tokens_details.reasoning_tokens == 0


SLOW = {"step_base_s": 0.01, "time_scale": 1.0, "eos_probability": 0.0}


async def _settled(stack: Stack) -> None:
    """Every lease released and every worker idle (bounded wait)."""
    for _ in range(250):
        leases = sum(w.load.in_flight for w in stack.state.registry.all())
        busy = sum(w.scheduler.num_running + w.scheduler.num_waiting for w in stack.fleet.workers)
        if leases == 0 and busy == 0:
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"still {leases} leases and {busy} sequences")


@pytest.mark.stack(workers=1, sim=SLOW)
async def test_a_stop_string_ends_the_request_though_the_aborted_stream_stays_open(stack: Stack) -> None:
    """The gateway ends its side of a worker stream it no longer needs and then sends Abort;
    SGLang never ends an aborted stream, so waiting for it would hang the request."""
    (worker,) = stack.fleet.workers
    started = asyncio.get_running_loop().time()
    done = await stack.client.chat.completions.create(
        model=stack.model, messages=_reply("alpha beta STOP gamma " + "delta " * 300), max_tokens=400, stop=["STOP"],
    )
    assert done.choices[0].finish_reason == "stop" and done.choices[0].message.content.startswith("alpha beta")
    assert asyncio.get_running_loop().time() - started < 3.0  # 400 tokens would take 4 s
    await _settled(stack)
    assert worker.counters.aborted == 1


@pytest.mark.stack(workers=1, sim=SLOW)
async def test_a_client_that_goes_away_frees_its_slot(stack: Stack) -> None:
    (worker,) = stack.fleet.workers
    async with stack.http.stream(
        "POST", "/v1/chat/completions",
        json={"model": stack.model, "messages": HI, "max_tokens": 400, "stream": True},
    ) as response:
        async for line in response.aiter_lines():
            if line.startswith("data: {") and '"content"' in line:
                break
    await _settled(stack)
    assert worker.counters.aborted == 1


OPENAI_FALLBACK = {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "min_p": 0.0, "repetition_penalty": 1.0}
CHOICES = {"temperature": [None, 0.0, 0.7], "top_p": [None, 0.5], "top_k": [None, 5], "min_p": [None, 0.1],
           "repetition_penalty": [None, 1.2], "max_tokens": [3, None], "n": [1, 2]}


def _corpus(size: int) -> list[dict[str, object]]:
    """``size`` requests walking every choice of every knob (None: the request omits it)."""
    out = []
    for i in range(size):
        body: dict[str, object] = {}
        for j, (name, values) in enumerate(CHOICES.items()):
            value = values[(i // (j + 1) + j) % len(values)]
            if value is not None:
                body[name] = value
        out.append(body)
    return out


def sglang_would_send(body: dict[str, object], *, chat: bool) -> dict[str, object]:
    """What SGLang's own OpenAI server puts in the scheduler's SamplingParams for ``body``:
    a value the request sends; for chat, else the model's generation default; else
    OpenAI's (written from SGLang's rules, independently of the gateway's code)."""
    out: dict[str, object] = {}
    for name, fallback in OPENAI_FALLBACK.items():
        value = body.get(name)
        if value is None and chat:
            value = QWEN3_DEFAULTS.get(name)
        out[name] = fallback if value is None else value
    out["max_new_tokens"] = body.get("max_tokens", None if chat else 16)  # completions' default is 16
    out["n"] = body.get("n", 1)
    return out


def received_values(request: object) -> dict[str, object]:
    sp = request.sampling_params  # type: ignore[attr-defined]
    return {
        "temperature": round(sp.temperature, 5), "top_p": round(sp.top_p, 5), "top_k": sp.top_k,
        "min_p": round(sp.min_p, 5), "repetition_penalty": round(sp.repetition_penalty, 5),
        "max_new_tokens": sp.max_new_tokens if sp.HasField("max_new_tokens") else None, "n": sp.n,
    }


@pytest.mark.stack(workers=1)
async def test_a_corpus_reaches_the_worker_as_sglang_would_send_it(stack: Stack) -> None:
    (worker,) = stack.fleet.workers
    corpus = _corpus(48)
    diffs = []
    for i, body in enumerate(corpus):
        chat = i % 3 != 2
        known = {k: v for k, v in body.items() if k in ("temperature", "top_p", "max_tokens", "n")}
        extra = {k: v for k, v in body.items() if k not in known}  # SGLang's extensions
        if chat:
            await stack.client.chat.completions.create(model=stack.model, messages=HI, extra_body=extra, **known)  # type: ignore[call-overload]
        else:
            await stack.client.completions.create(model=stack.model, prompt="hi", extra_body=extra, **known)  # type: ignore[call-overload]
        want = {k: round(v, 5) if isinstance(v, float) else v for k, v in sglang_would_send(body, chat=chat).items()}
        got = received_values(worker.received[-1])
        if got != want:
            diffs.append((body, want, got))
    assert len(corpus) >= 40
    assert diffs == [], "\n".join(f"{b}: want {w} got {g}" for b, w, g in diffs[:4])
