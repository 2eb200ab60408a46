"""Generate on a simulated worker, over real gRPC: the contract real workers keep."""

from __future__ import annotations

import grpc
import pytest
from google.protobuf import struct_pb2

from gateway.proto import sglang_scheduler_pb2_grpc as pb_grpc
from gateway_lab.sim.fleet import SimFleet
from gateway_lab.sim.vocab import REPLY_CLOSE, REPLY_OPEN
from gateway_lab.sim.worker import SimWorker

from .conftest import PROMPT, address, by_index, cfg, collect, request


async def test_streaming_and_non_streaming_agree(stub: pb_grpc.SglangSchedulerStub) -> None:
    streamed = by_index(await collect(stub, request(PROMPT, stream=True, max_new=12)))[0]
    whole = by_index(await collect(stub, request(PROMPT, stream=False, max_new=12)))[0]
    assert whole.chunks == [] and whole.complete is not None
    assert len(whole.complete.output_ids) == 12
    assert streamed.streamed_ids == list(whole.complete.output_ids)
    # One new token per chunk, running totals, then a complete repeating the last chunk.
    assert [list(c.token_ids) for c in streamed.chunks] == [[t] for t in whole.complete.output_ids]
    assert [c.completion_tokens for c in streamed.chunks] == list(range(1, 13))
    assert all(c.prompt_tokens == len(PROMPT) for c in streamed.chunks)
    assert streamed.complete is not None
    assert list(streamed.complete.output_ids) == list(streamed.chunks[-1].token_ids)
    assert streamed.complete.finish_reason == whole.complete.finish_reason == "length"
    assert streamed.complete.completion_tokens == 12
    assert not streamed.complete.HasField("matched_token_id")


async def test_outputs_are_deterministic_and_seeded(
    stub: pb_grpc.SglangSchedulerStub, worker: SimWorker
) -> None:
    async def ids(prompt: list[int], seed: int | None = None) -> list[int]:
        req = request(prompt, max_new=16)
        if seed is not None:
            req.sampling_params.custom_params.update({"seed": seed})
        return list(by_index(await collect(stub, req))[0].complete.output_ids)

    a = await ids(PROMPT)
    assert a == await ids(PROMPT)
    assert a != await ids([*PROMPT[:-1], 7])
    assert await ids(PROMPT, seed=5) == await ids(PROMPT, seed=5) != a
    ordinary = set(worker.vocab.output_ids)
    assert all(t in ordinary for t in a)
    assert not set(a) & set(worker.vocab.eos_ids)


async def test_n_samples_are_multiplexed_by_index(stub: pb_grpc.SglangSchedulerStub) -> None:
    results = {}
    for stream in (True, False):
        samples = by_index(await collect(stub, request(PROMPT, stream=stream, n=3, max_new=6)))
        assert sorted(samples) == [0, 1, 2]
        assert all(samples[i].complete.index == i for i in range(3))
        if stream:
            assert all(c.index == i for i in range(3) for c in samples[i].chunks)
            results[stream] = [samples[i].streamed_ids for i in range(3)]
        else:
            results[stream] = [list(samples[i].complete.output_ids) for i in range(3)]
    assert results[True] == results[False]
    assert len({tuple(o) for o in results[False]}) == 3, "each sample has its own output"
    # Sample 0 of an n-request is the stream a single-sample request gets.
    alone = by_index(await collect(stub, request(PROMPT, n=1, max_new=6)))[0].complete.output_ids
    assert list(alone) == results[False][0]


async def test_stop_token_ids_end_with_matched_token(stub: pb_grpc.SglangSchedulerStub) -> None:
    full = list(by_index(await collect(stub, request(PROMPT, max_new=10)))[0].complete.output_ids)
    stop = full[4]
    cut = full.index(stop) + 1
    for stream in (False, True):
        s = by_index(
            await collect(stub, request(PROMPT, stream=stream, max_new=10, stop_token_ids=[stop]))
        )[0]
        assert s.complete.finish_reason == "stop"
        assert s.complete.matched_token_id == stop
        assert s.complete.completion_tokens == cut
        got = s.streamed_ids if stream else list(s.complete.output_ids)
        assert got == full[:cut]  # the matched token is part of the output


async def test_min_new_tokens_defers_stops(stub: pb_grpc.SglangSchedulerStub) -> None:
    full = list(by_index(await collect(stub, request(PROMPT, max_new=10)))[0].complete.output_ids)
    s = by_index(
        await collect(stub, request(PROMPT, max_new=10, stop_token_ids=[full[0]], min_new_tokens=3))
    )[0]
    assert s.complete.completion_tokens >= 3


async def test_eos_probability_ignore_eos_and_min_new_tokens() -> None:
    async with SimFleet.start(1, cfg(eos_probability=1.0)) as fleet:
        async with grpc.aio.insecure_channel(address(fleet.urls[0])) as ch:
            stub = pb_grpc.SglangSchedulerStub(ch)
            eos = fleet.workers[0].vocab.eos_ids[0]
            s = by_index(await collect(stub, request(PROMPT, max_new=10)))[0].complete
            assert s.finish_reason == "stop" and s.matched_token_id == eos
            assert list(s.output_ids) == [eos] and s.completion_tokens == 1
            s = by_index(await collect(stub, request(PROMPT, max_new=5, ignore_eos=True)))[
                0
            ].complete
            assert (
                s.finish_reason == "length" and s.completion_tokens == 5 and eos not in s.output_ids
            )
            s = by_index(await collect(stub, request(PROMPT, max_new=10, min_new_tokens=4)))[
                0
            ].complete
            assert (
                s.finish_reason == "stop" and s.completion_tokens == 5 and s.output_ids[-1] == eos
            )


async def test_max_new_tokens_default_and_context_clip() -> None:
    async with SimFleet.start(1, cfg(default_max_new_tokens=7, context_length=50)) as fleet:
        async with grpc.aio.insecure_channel(address(fleet.urls[0])) as ch:
            stub = pb_grpc.SglangSchedulerStub(ch)
            s = by_index(await collect(stub, request(PROMPT[:20], max_new=None)))[0].complete
            assert s.completion_tokens == 7 and s.finish_reason == "length"
            s = by_index(await collect(stub, request(PROMPT, max_new=100)))[0].complete
            assert s.completion_tokens == 10  # 40 prompt tokens + 10 = the context length
            s = by_index(await collect(stub, request(PROMPT, max_new=0, stream=True)))[0]
            assert s.chunks == [] and s.complete.completion_tokens == 0
            assert s.complete.finish_reason == "length"


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda r: r.sampling_params.stop.append("</s>"), "stop"),
        (lambda r: r.sampling_params.ClearField("n"), "n must be"),
        (lambda r: r.tokenized.ClearField("input_ids"), "input_ids"),
        (lambda r: r.tokenized.input_ids.extend([10**7]), "vocabulary"),
        (lambda r: r.tokenized.input_ids.extend([5] * 40000), "context length"),
    ],
)
async def test_invalid_requests(
    stub: pb_grpc.SglangSchedulerStub, worker: SimWorker, mutate, message: str
) -> None:
    req = request(PROMPT, stream=True)
    mutate(req)
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await collect(stub, req)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert message in err.value.details()
    assert worker.counters.invalid == 1 and worker.scheduler.num_running == 0


async def test_request_larger_than_kv_pool_is_refused() -> None:
    async with SimFleet.start(1, cfg(kv_capacity_tokens=32, page_size=4)) as fleet:
        async with grpc.aio.insecure_channel(address(fleet.urls[0])) as ch:
            stub = pb_grpc.SglangSchedulerStub(ch)
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await collect(stub, request(PROMPT, max_new=8))
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert "KV pool" in err.value.details()


async def test_logprobs(stub: pb_grpc.SglangSchedulerStub) -> None:
    prompt = PROMPT[:10]

    def with_lp(stream: bool, start: int) -> object:
        r = request(prompt, stream=stream, max_new=5)
        r.return_logprob = True
        r.top_logprobs_num = 3
        r.logprob_start_len = start
        r.token_ids_logprob.extend([prompt[0], prompt[1]])
        return r

    whole = by_index(await collect(stub, with_lp(False, 0)))[0].complete
    olp = whole.output_logprobs
    assert list(olp.token_ids) == list(whole.output_ids)
    assert len(olp.token_logprobs) == 5 and all(v < 0 for v in olp.token_logprobs)
    assert len(olp.top_logprobs) == 5
    for row, tok, v in zip(olp.top_logprobs, olp.token_ids, olp.token_logprobs, strict=True):
        assert (
            len(row.values) == 3 and row.token_ids[0] == tok and row.values[0] == pytest.approx(v)
        )
        assert list(row.values) == sorted(row.values, reverse=True)
    assert len(olp.token_ids_logprobs) == 5 and all(
        len(r.values) == 2 for r in olp.token_ids_logprobs
    )
    ilp = whole.input_logprobs
    assert list(ilp.token_ids) == prompt
    assert not ilp.token_logprobs[0].HasField("value")
    assert all(e.HasField("value") and e.value < 0 for e in ilp.token_logprobs[1:])

    streamed = by_index(await collect(stub, with_lp(True, 0)))[0]
    assert [c.output_logprobs.token_logprobs[0] for c in streamed.chunks] == list(
        olp.token_logprobs
    )
    assert streamed.chunks[0].HasField("input_logprobs")
    assert list(streamed.chunks[0].input_logprobs.token_ids) == prompt
    assert not any(c.HasField("input_logprobs") for c in streamed.chunks[1:])
    assert not streamed.complete.HasField("input_logprobs")

    later = by_index(await collect(stub, with_lp(False, 4)))[0].complete.input_logprobs
    assert list(later.token_ids) == prompt[4:]
    assert all(e.HasField("value") for e in later.token_logprobs)
    assert [e.value for e in later.token_logprobs] == [e.value for e in ilp.token_logprobs[4:]]

    plain = by_index(await collect(stub, request(prompt, max_new=5)))[0].complete
    assert not plain.HasField("output_logprobs") and not plain.HasField("input_logprobs")


async def test_stream_interval_groups_tokens(stub: pb_grpc.SglangSchedulerStub) -> None:
    s = by_index(await collect(stub, request(PROMPT, stream=True, max_new=10, stream_interval=4)))[
        0
    ]
    assert [len(c.token_ids) for c in s.chunks] == [4, 4, 2]
    assert list(s.complete.output_ids) == list(s.chunks[-1].token_ids)


async def test_cached_tokens_on_a_repeated_prompt(
    stub: pb_grpc.SglangSchedulerStub, worker: SimWorker
) -> None:
    prompt = list(range(2000, 2100))  # 100 tokens: 6 whole pages of 16
    first = by_index(await collect(stub, request(prompt, stream=True, max_new=4)))[0]
    assert first.complete.cached_tokens == 0 and all(c.cached_tokens == 0 for c in first.chunks)
    second = by_index(await collect(stub, request(prompt, stream=True, max_new=4)))[0]
    assert second.complete.cached_tokens == 96 and all(c.cached_tokens == 96 for c in second.chunks)
    # A prompt that shares the first 40 tokens hits two whole pages.
    third = by_index(await collect(stub, request(prompt[:40] + [5] * 30, max_new=4)))[0]
    assert third.complete.cached_tokens == 32
    # The previous output was cached too (prompt + output, like SGLang): a follow-up turn hits it.
    turn2 = prompt + list(second.complete.output_ids) + list(range(3000, 3030))
    assert by_index(await collect(stub, request(turn2, max_new=2)))[0].complete.cached_tokens == 96
    c = worker.counters
    assert c.cached_tokens == 96 + 32 + 96 and c.prompt_tokens == 100 + 100 + 70 + len(turn2)
    assert worker.scheduler_load().cache_hit_rate == pytest.approx(c.cache_hit_rate)


async def test_fully_cached_prompt_recomputes_its_last_token(
    stub: pb_grpc.SglangSchedulerStub,
) -> None:
    prompt = list(range(2000, 2032))  # exactly 2 pages
    await collect(stub, request(prompt, max_new=1))
    s = by_index(await collect(stub, request(prompt, max_new=1)))[0].complete
    assert s.cached_tokens == 16


async def test_scripted_reply(stub: pb_grpc.SglangSchedulerStub, worker: SimWorker) -> None:
    vocab = worker.vocab
    text = '<think>short</think>Calling.<tool_call>{"name": "f", "arguments": {"x": 1}}</tool_call>'
    prompt = vocab.encode(f"<|im_start|>user\nplease {REPLY_OPEN}{text}{REPLY_CLOSE}<|im_end|>\n")
    script = vocab.encode(text)
    eos = vocab.eos_ids[0]
    for stream in (False, True):
        samples = by_index(await collect(stub, request(prompt, stream=stream, n=2, max_new=200)))
        for s in samples.values():
            got = s.streamed_ids if stream else list(s.complete.output_ids)
            assert got == [*script, eos]
            assert s.complete.finish_reason == "stop" and s.complete.matched_token_id == eos
            assert vocab.decode(got[:-1]) == text
    s = by_index(await collect(stub, request(prompt, max_new=3)))[0].complete
    assert list(s.output_ids) == script[:3] and s.finish_reason == "length"
    s = by_index(await collect(stub, request(prompt, max_new=len(script) + 3, ignore_eos=True)))[0]
    assert list(s.complete.output_ids[: len(script)]) == script
    assert s.complete.finish_reason == "length" and eos not in s.complete.output_ids


async def test_scripted_replies_can_be_turned_off() -> None:
    async with SimFleet.start(1, cfg(scripted_replies=False)) as fleet:
        vocab = fleet.workers[0].vocab
        async with grpc.aio.insecure_channel(address(fleet.urls[0])) as ch:
            stub = pb_grpc.SglangSchedulerStub(ch)
            prompt = vocab.encode(f"{REPLY_OPEN}hello{REPLY_CLOSE}")
            s = by_index(await collect(stub, request(prompt, max_new=4)))[0].complete
            assert list(s.output_ids) != vocab.encode("hello") and s.finish_reason == "length"


async def test_custom_params_seed_must_be_numeric(stub: pb_grpc.SglangSchedulerStub) -> None:
    req = request(PROMPT)
    req.sampling_params.custom_params.CopyFrom(
        struct_pb2.Struct(fields={"seed": struct_pb2.Value(string_value="x")})
    )
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await collect(stub, req)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
