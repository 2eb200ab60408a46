"""The engine (pipeline/engine.py): the prompt checks every request gets, the worker
request it builds from a prepared request, and the model's fast encoder, built once off the
event loop at its first long prompt or its Nth prompt."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

import pytest

from gateway.pipeline import encoder_build
from gateway.pipeline.catalog import ModelEntry
from gateway.pipeline.engine import Engine, EngineConfig
from gateway.pipeline.limits import LimitsConfig
from gateway.pipeline.prepared import PreparedRequest
from gateway.pipeline.resume import ResumeConfig
from gateway.pipeline.router import Router
from gateway.policies.factory import make_policy
from gateway.proto import sglang_scheduler_pb2 as pb
from gateway.protocol.errors import ContextLengthExceededError, InvalidRequestError
from gateway.protocol.sampling import SamplingOptions
from gateway.tokenization import ChatPromptCache, ChatTemplate, Tokenizer
from gateway.workers.registry import WorkerRegistry
from tests.tokenization.helpers import qwen_files


class _Catalog:
    def __init__(self, entry: ModelEntry) -> None:
        self.entry = entry

    def get(self, name: str | None) -> ModelEntry:
        return self.entry

    def worker_model(self, name: str) -> str:
        return self.entry.worker_model or name


def _engine(tmp_path: Path, **config: int) -> tuple[Engine, ModelEntry]:
    tokenizer = Tokenizer.from_path(qwen_files())
    entry = ModelEntry("m", tokenizer, "path", 0, ChatPromptCache(tokenizer))
    settings = EngineConfig(**{"offload_chars": 4096, "fast_encoder_after": 0, **config})
    engine = Engine(Router(WorkerRegistry(), lambda role: make_policy()), _Catalog(entry), config=settings)  # type: ignore[arg-type]
    return engine, entry


_REAL_BUILD = encoder_build.build_encoder
_REAL_PLAN_IN_CHILD = encoder_build.plan_in_child


def _spy_on_builds() -> list[int]:
    """Record the thread of every fast-encoder build (until ``_unspy``). The plan is made in
    this process (``pipeline/test_encoder_build.py`` covers the child process)."""
    built_on: list[int] = []

    def spy(tokenizer: Tokenizer, make: object = None) -> None:
        built_on.append(threading.get_ident())
        _REAL_BUILD(tokenizer)

    encoder_build.build_encoder = spy  # type: ignore[assignment]
    encoder_build.plan_in_child = lambda path, make: make(path)  # type: ignore[assignment]
    return built_on


def _unspy() -> None:
    encoder_build.build_encoder = _REAL_BUILD
    encoder_build.plan_in_child = _REAL_PLAN_IN_CHILD


async def test_long_prompts_build_the_encoder_once_off_the_loop(tmp_path: Path) -> None:
    engine, entry = _engine(tmp_path)
    tokenizer = entry.tokenizer
    try:
        built_on = _spy_on_builds()
        short = "hello there " * 10
        assert await engine.encode_prompt(entry, short) == tokenizer.backend.encode(short).ids
        assert not built_on and not tokenizer.fast_bpe_ready  # short prompts never pay for it
        long = "alpha river stone light " * 400
        want = tokenizer.backend.encode(long).ids
        assert await engine.encode_prompt(entry, long) == want
        for _ in range(200):
            if tokenizer.fast_bpe_ready:
                break
            await asyncio.sleep(0.05)
        assert tokenizer.fast_bpe_ready and tokenizer.fast_bpe is not None
        assert await engine.encode_prompt(entry, long + " again") == tokenizer.backend.encode(long + " again").ids
        messages = [{"role": "user", "content": long}]
        text, ids = await engine.render_chat(entry, messages, tools=None, chat_template_kwargs=None)
        assert ids == tokenizer.backend.encode(text, add_special_tokens=False).ids
        assert len(built_on) == 1 and built_on[0] != threading.get_ident()  # off the event loop
    finally:
        _unspy()
        engine.close()


async def test_the_nth_short_prompt_builds_the_encoder_once_off_the_loop(tmp_path: Path) -> None:
    engine, entry = _engine(tmp_path, fast_encoder_after=5)
    tokenizer = entry.tokenizer
    try:
        built_on = _spy_on_builds()
        messages = [{"role": "user", "content": "hello there, how are you"}]
        for n in range(4):  # chat renders and plain prompts both count
            if n % 2:
                await engine.encode_prompt(entry, f"short prompt {n}")
            else:
                await engine.render_chat(entry, messages, tools=None, chat_template_kwargs=None)
        await asyncio.sleep(0.05)
        assert not built_on and not tokenizer.fast_bpe_ready
        text, ids = await engine.render_chat(entry, messages, tools=None, chat_template_kwargs=None)
        assert ids == tokenizer.backend.encode(text, add_special_tokens=False).ids  # HF serves meanwhile
        for _ in range(200):
            if tokenizer.fast_bpe_ready:
                break
            await asyncio.sleep(0.05)
        assert tokenizer.fast_bpe_ready and tokenizer.fast_bpe is not None
        for _ in range(10):  # built once, not again
            assert await engine.render_chat(entry, messages, tools=None, chat_template_kwargs=None) == (text, ids)
        assert len(built_on) == 1 and built_on[0] != threading.get_ident()
    finally:
        _unspy()
        engine.close()


async def test_zero_builds_only_at_a_long_prompt(tmp_path: Path) -> None:
    engine, entry = _engine(tmp_path, fast_encoder_after=0)
    try:
        for n in range(300):
            await engine.encode_prompt(entry, f"short prompt {n}")
        await asyncio.sleep(0.05)
        assert not entry.tokenizer.fast_bpe_ready and not engine._building
    finally:
        engine.close()


def test_a_negative_count_is_refused() -> None:
    with pytest.raises(ValueError, match="fast_encoder_after"):
        EngineConfig(fast_encoder_after=-1)


# ------------------------------------------------------------- checks and the worker request

_TOKENIZER: Tokenizer | None = None


def _checked_engine(
    context: int = 0, *, limits: LimitsConfig | None = None, resume: ResumeConfig | None = None, **config: int
) -> tuple[Engine, ModelEntry]:
    global _TOKENIZER
    if _TOKENIZER is None:
        _TOKENIZER = Tokenizer.from_path(qwen_files())
    entry = ModelEntry("m", _TOKENIZER, "path", context, ChatPromptCache(_TOKENIZER), worker_model="worker-m")
    engine = Engine(
        Router(WorkerRegistry(), lambda role: make_policy()), _Catalog(entry),  # type: ignore[arg-type]
        config=EngineConfig(**config), limits=limits, resume=resume,
    )
    return engine, entry


def test_prepare_checks_the_prompt_and_keeps_what_the_request_asked() -> None:
    engine, entry = _checked_engine(context=64)
    try:
        sampling = SamplingOptions(temperature=0.0, max_new_tokens=8, stop=("END",))
        prepared = engine.prepare(entry, [11, 12, 13], sampling, stream=True, request_id="r1", routing_key="k")
        assert (prepared.request_id, prepared.model, prepared.prompt_ids) == ("r1", "m", [11, 12, 13])
        assert prepared.sampling.max_new_tokens == 8 and prepared.stream and prepared.routing_key == "k"
        assert "END" in prepared.stop_plan.stop_strings
        route = engine.route_request(prepared)
        assert (route.model, route.token_ids, route.max_new_tokens, route.pool) == ("worker-m", [11, 12, 13], 8, "regular")
        with pytest.raises(InvalidRequestError, match="empty") as empty:
            engine.prepare(entry, [], sampling, stream=False)
        assert empty.value.param == "prompt"
        with pytest.raises(InvalidRequestError, match="token ids must be in") as outside:
            engine.prepare(entry, [entry.tokenizer.vocab_size], sampling, stream=False)
        assert (outside.value.status, outside.value.param) == (400, "prompt")
    finally:
        engine.close()


def test_the_context_holds_the_prompt_and_the_tokens_asked_for() -> None:
    """SGLang's own server's rules: prompt + max_tokens must stay below the context, and
    a prompt as long as the context is refused whatever is asked for."""
    engine, entry = _checked_engine(context=16)
    try:
        Engine.check_context(entry, 10, 5, param="messages")  # one token of room left: fine
        with pytest.raises(ContextLengthExceededError, match="maximum context length is 16") as over:
            Engine.check_context(entry, 10, 6, param="messages")
        assert over.value.param == "messages"
        with pytest.raises(ContextLengthExceededError, match="the prompt has 16 tokens"):
            Engine.check_context(entry, 16, 0, param="messages")
        # A prompt of 12 leaves room for 3: a larger max_tokens is refused, not silently cut.
        with pytest.raises(ContextLengthExceededError):
            engine.prepare(entry, list(range(100, 112)), SamplingOptions(max_new_tokens=4), stream=False, prompt_param="messages")
        prepared = engine.prepare(entry, list(range(100, 112)), SamplingOptions(max_new_tokens=3), stream=False)
        assert prepared.sampling.max_new_tokens == 3
    finally:
        engine.close()


def test_the_workers_prompt_limit_is_refused_before_any_worker() -> None:
    engine, entry = _checked_engine(context=16)
    entry.max_input_tokens = 10  # the schedulers' max_req_input_len
    try:
        Engine.check_context(entry, 9, 0, param="prompt")
        with pytest.raises(ContextLengthExceededError, match="at most 9 tokens"):
            Engine.check_context(entry, 10, 0, param="prompt")
    finally:
        engine.close()


def test_a_prompts_length_alone_gets_the_error_prepare_gives_it() -> None:
    """``check_prompt_length`` (a door's check before any per-id work) refuses what
    ``prepare`` refuses for the length alone, with the same error, and nothing else."""
    engine, entry = _checked_engine(context=16, limits=LimitsConfig(max_prompt_tokens=20))
    try:
        sampling = SamplingOptions(max_new_tokens=1)
        for length in (16, 17, 21):
            with pytest.raises(InvalidRequestError) as whole:
                engine.prepare(entry, [100] * length, sampling, stream=False)
            with pytest.raises(InvalidRequestError) as alone:
                engine.check_prompt_length(entry, length)
            assert repr(alone.value) == repr(whole.value) and type(alone.value) is type(whole.value)
        assert engine.check_prompt_length(entry, 15) is None
        entry.max_input_tokens = 10  # the workers' own limit: its error depends on the tokens asked for
        assert engine.check_prompt_length(entry, 12) is None
    finally:
        engine.close()


def test_a_hopeless_prompt_is_refused_before_the_tokenizer_runs() -> None:
    engine, entry = _checked_engine(limits=LimitsConfig(max_prompt_tokens=8))
    try:
        entry.tokenizer.length_bound  # noqa: B018  (computed once; the engine submits it to its pool otherwise)
        engine.refuse_hopeless(entry, "x" * 8)  # no more characters than the limit: never refused unread
        with pytest.raises(InvalidRequestError, match="at most 8") as refused:
            engine.refuse_hopeless(entry, "hello world " * 400, param="messages")
        assert (refused.value.param, refused.value.code) == ("messages", "prompt_too_long")
    finally:
        engine.close()


def test_the_worker_request_always_carries_temperature_n_and_the_prompt() -> None:
    """Workers read proto3 zeros as values: temperature 0 is greedy, so it is always sent."""
    engine, entry = _checked_engine()
    try:
        sampling = SamplingOptions(temperature=0.0, n=1, max_new_tokens=200, seed=7)
        prepared = engine.prepare(entry, [5, 6, 7], sampling, stream=True, request_id="r2", prompt_text="abc")
        request = engine.generate_request(prepared)
        assert request.request_id == "r2" and list(request.tokenized.input_ids) == [5, 6, 7]
        assert request.tokenized.original_text == "abc"
        assert request.sampling_params.temperature == 0.0 and request.sampling_params.n == 1
        assert request.sampling_params.max_new_tokens == 200
        assert request.stream and not request.return_logprob
    finally:
        engine.close()


def test_a_short_whole_answer_is_asked_for_in_one_message() -> None:
    """Not streamed, no stop strings, one sample and capped at the unary interval: the worker
    answers with its complete alone; longer answers stream in coarse chunks so progress shows."""
    engine, entry = _checked_engine(resume=ResumeConfig(unary_stream_interval=16))
    try:
        short = engine.generate_request(engine.prepare(entry, [5, 6], SamplingOptions(max_new_tokens=16), stream=False))
        assert not short.stream
        long = engine.generate_request(engine.prepare(entry, [5, 6], SamplingOptions(max_new_tokens=17), stream=False))
        assert long.stream and long.sampling_params.stream_interval == 16
        many = engine.generate_request(engine.prepare(entry, [5, 6], SamplingOptions(max_new_tokens=4, n=2), stream=False))
        assert many.stream
        stops = engine.generate_request(
            engine.prepare(entry, [5, 6], SamplingOptions(max_new_tokens=4, stop=("x",)), stream=False)
        )
        assert stops.stream and not stops.sampling_params.HasField("stream_interval")
        streamed = engine.generate_request(engine.prepare(entry, [5, 6], SamplingOptions(max_new_tokens=4), stream=True))
        assert streamed.stream and not streamed.sampling_params.HasField("stream_interval")
    finally:
        engine.close()


def test_the_operator_stream_interval_wins() -> None:
    engine, entry = _checked_engine(worker_stream_interval=4)
    try:
        request = engine.generate_request(engine.prepare(entry, [5, 6], SamplingOptions(max_new_tokens=64), stream=True))
        assert request.sampling_params.stream_interval == 4
    finally:
        engine.close()


def test_engine_config_refuses_negative_knobs() -> None:
    for bad in ({"worker_stream_interval": -1}, {"busy_stream_interval": -1}, {"busy_in_flight": 0}, {"fast_encoder_after": -1}):
        with pytest.raises(ValueError):
            EngineConfig(**bad)



async def test_stop_strings_go_to_workers_that_match_them_and_ids_to_the_rest() -> None:
    """Workers that say they have a tokenizer get the client's stop strings as sent (SGLang's
    own frontends' form); a fleet with any worker that has none gets one-token strings as ids."""
    from tests.fake_transport import MODEL, FakeTransport, fleet

    tokenizer = Tokenizer.from_path(qwen_files())
    entry = ModelEntry("m", tokenizer, "path", 0, ChatPromptCache(tokenizer), worker_model=MODEL)
    sampling = SamplingOptions(max_new_tokens=8, stop=("\n\n", " Paris"), stop_token_ids=(9,))
    one_token = [tokenizer.token_id(s) for s in sampling.stop]
    assert None not in one_token

    async def worker_params(*transports: FakeTransport) -> pb.SamplingParams:
        f = await fleet(*transports)
        engine = Engine(f.router, _Catalog(entry), config=EngineConfig())  # type: ignore[arg-type]
        try:
            return engine.generate_request(engine.prepare(entry, [5, 6], sampling, stream=True)).sampling_params
        finally:
            engine.close()
            await f.registry.close()

    sp = await worker_params(FakeTransport("grpc://10.0.0.1:1", server_args={"skip_tokenizer_init": False}))
    assert list(sp.stop) == ["\n\n", " Paris"] and list(sp.stop_token_ids) == [9]
    sp = await worker_params(FakeTransport("grpc://10.0.0.1:1", server_args={"skip_tokenizer_init": False}),
                             FakeTransport("grpc://10.0.0.2:1"))
    assert list(sp.stop) == [] and list(sp.stop_token_ids) == [9, *one_token]


async def test_a_whole_answer_goes_unstreamed_when_its_budget_is_known() -> None:
    """A client that does not stream gets its answer unstreamed (SGLang's own frontends' form),
    n > 1 and logprobs included, whenever its token budget is known: its max_tokens, or with
    none what the model's context leaves after the prompt. Its wait is checked once its
    worker is unheard for --unary-whole-max-s (``whole_answer``). With neither a cap nor a
    known context, or on a model served disaggregated, it streams in coarse chunks."""
    import math

    from tests.fake_transport import MODEL, FakeTransport, fleet

    tokenizer = Tokenizer.from_path(qwen_files())
    known = ModelEntry("m", tokenizer, "path", 4096, ChatPromptCache(tokenizer), worker_model=MODEL)
    unknown = ModelEntry("m", tokenizer, "path", 0, ChatPromptCache(tokenizer), worker_model=MODEL)
    f = await fleet(FakeTransport("grpc://10.0.0.1:1"), FakeTransport("grpc://10.0.0.2:1"))
    engine = Engine(f.router, _Catalog(known), config=EngineConfig(),  # type: ignore[arg-type]
                    resume=ResumeConfig(unary_stream_interval=16, unary_whole_max_s=10.0))

    def prepared(entry: ModelEntry = known, stream: bool = False, **sampling: object) -> PreparedRequest:
        return engine.prepare(entry, [5, 6], SamplingOptions(**sampling), stream=stream)  # type: ignore[arg-type]

    def sent(entry: ModelEntry = known, stream: bool = False, **sampling: object) -> pb.GenerateRequest:
        return engine.generate_request(prepared(entry, stream, **sampling))

    try:
        for shape in ({}, {"n": 2}, {"logprobs": True, "top_logprobs": 2}):
            for cap in (400, 3000, None):  # whatever the cap, and with none
                request = sent(max_new_tokens=cap, **shape)
                assert not request.stream and not request.sampling_params.HasField("stream_interval"), (shape, cap)
                # No cap reaches the worker: its own default is the context's end, as SGLang's server sends it.
                assert request.sampling_params.HasField("max_new_tokens") is (cap is not None)
        assert engine._answer_budget(prepared(max_new_tokens=400)) == 400
        assert engine._answer_budget(prepared(max_new_tokens=None)) == 4096 - 2  # the context after the prompt
        assert engine.whole_answer(4094).check_s == 10.0
        # No cap and no known context: nothing bounds its deadline, it streams in chunks.
        assert engine._answer_budget(prepared(unknown, max_new_tokens=None)) == 0
        assert sent(unknown, max_new_tokens=None).sampling_params.stream_interval == 16
        assert not sent(unknown, max_new_tokens=400).stream
        assert sent(stream=True, max_new_tokens=4).stream
        slow = f.registry.all()[1]
        slow.role = "decode"  # served disaggregated: its halves keep the shared rules
        assert sent(max_new_tokens=400).stream and not sent(max_new_tokens=16).stream
        slow.role = "regular"
        engine.resume.unary_whole_max_s = 0.0
        assert sent(max_new_tokens=400).stream  # 0: only one-message answers go whole
        assert sent(max_new_tokens=None).stream and not sent(max_new_tokens=16).stream
        assert engine.whole_answer(400).check_s == math.inf  # their deadline alone
    finally:
        engine.close()
        await f.registry.close()


async def test_stop_strings_a_worker_matches_itself_need_no_stream() -> None:
    """Stop strings keep an answer streamed only where the gateway alone matches them (it
    must stop the worker early); workers that get them stop by themselves."""
    from tests.fake_transport import MODEL, FakeTransport, fleet

    tokenizer = Tokenizer.from_path(qwen_files())
    entry = ModelEntry("m", tokenizer, "path", 0, ChatPromptCache(tokenizer), worker_model=MODEL)
    sampling = SamplingOptions(max_new_tokens=64, stop=("\n\n", "zz"))

    async def sent(*transports: FakeTransport) -> pb.GenerateRequest:
        f = await fleet(*transports)
        engine = Engine(f.router, _Catalog(entry), config=EngineConfig())  # type: ignore[arg-type]
        try:
            return engine.generate_request(engine.prepare(entry, [5, 6], sampling, stream=False))
        finally:
            engine.close()
            await f.registry.close()

    own = await sent(FakeTransport("grpc://10.0.0.1:1", server_args={"skip_tokenizer_init": False}))
    assert not own.stream and list(own.sampling_params.stop) == ["\n\n", "zz"]
    gateway_only = await sent(FakeTransport("grpc://10.0.0.1:1"))
    assert gateway_only.stream and not gateway_only.sampling_params.HasField("stream_interval")


async def test_a_long_id_list_is_decoded_off_the_loop(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A client's ``/v1/detokenize`` may send millions of ids (seconds of decoding): past
    ``offload_chars`` ids the decode runs in the pool, as a long prompt's encode does."""
    engine, entry = _engine(tmp_path)
    decoded_on: list[int] = []
    real = Tokenizer.decode

    def spy(self: Tokenizer, ids: list[int], skip_special_tokens: bool = True) -> str:
        decoded_on.append(threading.get_ident())
        return real(self, ids, skip_special_tokens)

    monkeypatch.setattr(Tokenizer, "decode", spy)
    text = "hello world, " * 2000
    ids = entry.tokenizer.backend.encode(text, add_special_tokens=False).ids
    assert len(ids) > engine.config.offload_chars
    assert await engine.decode(entry, ids[:3], skip_special_tokens=False) == "hello world,"
    assert decoded_on == [threading.get_ident()]  # short: inline
    assert await engine.decode(entry, ids, skip_special_tokens=False) == text
    assert decoded_on[1] != threading.get_ident()


async def test_a_long_prompt_behind_a_cached_prefix_is_encoded_inline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Past ``offload_chars`` a prompt is encoded in the pool only while the part the prompt
    cache does not hold is that long: a shared prefix's next question is a short encode."""
    engine, entry = _engine(tmp_path)
    pooled: list[object] = []
    real_submit = engine._pool.submit

    def submit(fn: Any, /, *args: Any, **kwargs: Any) -> Any:
        pooled.append(fn)
        return real_submit(fn, *args, **kwargs)

    monkeypatch.setattr(engine._pool, "submit", submit)
    shared = "alpha beta gamma delta " * 400
    assert len(shared) > engine.config.offload_chars
    first = shared + "first question"
    assert await engine.encode_prompt(entry, first) == entry.tokenizer.encode(first, add_special_tokens=True)
    assert len(pooled) == 1  # nothing cached: the whole text in the pool
    second = shared + "second question"
    assert await engine.encode_prompt(entry, second) == entry.tokenizer.encode(second, add_special_tokens=True)
    assert len(pooled) == 1  # its shared part cached: inline
    unrelated = "omega theta kappa " * 400
    assert await engine.encode_prompt(entry, unrelated) == entry.tokenizer.encode(unrelated, add_special_tokens=True)
    assert len(pooled) == 2  # a long text the cache does not hold: the pool, as before


async def test_a_chat_past_the_context_is_not_kept_by_the_prompt_cache(tmp_path: Path) -> None:
    engine, entry = _engine(tmp_path, chat_template_timeout_s=60)  # the first render compiles the template
    try:
        messages = [{"role": "user", "content": f"message {i} of a long conversation"} for i in range(40)]
        _, ids = await engine.render_chat(entry, messages, tools=None, chat_template_kwargs=None)
        assert entry.prompt_cache.stats().entries > 0  # no limit: kept
        entry.prompt_cache.clear()
        entry.max_context_length = len(ids)  # this prompt is refused now
        _, again = await engine.render_chat(entry, messages, tools=None, chat_template_kwargs=None)
        assert again == ids and entry.prompt_cache.stats().entries == 0
        engine.limits = LimitsConfig(max_prompt_tokens=len(ids) - 1)
        entry.max_context_length = 0
        assert engine._refused_at(entry) == len(ids)
        entry.max_input_tokens = len(ids) - 5
        assert engine._refused_at(entry) == len(ids) - 5
        entry.max_input_tokens, engine.limits = 0, LimitsConfig()
        assert engine._refused_at(entry) == 0
        await engine.render_chat(entry, messages, tools=None, chat_template_kwargs=None)
        assert entry.prompt_cache.stats().entries > 0  # no limit: kept
    finally:
        engine.close()


async def test_a_chat_shape_the_template_memo_knows_is_rendered_without_the_runner(tmp_path: Path) -> None:
    engine, entry = _engine(tmp_path)
    runs: list[int] = []
    real = engine.templates.render

    async def counted(*args: object, **kwargs: object) -> object:
        runs.append(1)
        return await real(*args, **kwargs)  # type: ignore[arg-type]

    engine.templates.render = counted  # type: ignore[method-assign]
    template = entry.tokenizer.chat_template()
    reference = ChatTemplate(template.source, template.special_tokens, memo=False)
    try:
        for i in range(5):
            messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": f"question {i}"}]
            text, ids = await engine.render_chat(entry, messages, tools=None, chat_template_kwargs=None)
            assert text == reference.render(messages)
            assert ids == entry.tokenizer.backend.encode(text, add_special_tokens=False).ids
        assert len(runs) == 2  # seen, then probed: answered by the memo from the third on
        with pytest.raises(InvalidRequestError):  # bad input is the same client error without the runner
            await engine.render_chat(entry, [{"role": 3}], tools=None, chat_template_kwargs=None)
        big = [{"role": "user", "content": "x" * 5000}]  # past offload_chars: the runner, as before
        await engine.render_chat(entry, big, tools=None, chat_template_kwargs=None)
        assert len(runs) == 3
    finally:
        engine.close()


async def test_a_text_far_past_offload_chars_goes_to_the_pool_without_a_walk(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A text many times ``offload_chars`` is not cut and walked on the loop to size it."""
    engine, entry = _engine(tmp_path, offload_chars=256)
    walked: list[int] = []
    real = ChatPromptCache.new_chars

    def spy(self: ChatPromptCache, text: str, **kwargs: Any) -> int:
        walked.append(len(text))
        return real(self, text, **kwargs)

    monkeypatch.setattr(ChatPromptCache, "new_chars", spy)
    near = "alpha beta gamma delta " * 100  # past offload_chars, within the walk's bound
    far = "alpha beta gamma delta " * 400
    await engine.encode_prompt(entry, near)
    await engine.encode_prompt(entry, far)
    assert walked == [len(near)]


def test_the_hopeless_and_kept_limits_are_the_least_of_those_set() -> None:
    engine, entry = _checked_engine()
    try:
        entry.tokenizer.length_bound  # noqa: B018  (computed once, as above)
        values = (-1, 0, 5, 8, 9, 40)
        for cap in values:
            for context in values:
                for max_input in values:
                    engine.limits = LimitsConfig(max_prompt_tokens=max(0, cap))
                    entry.max_context_length, entry.max_input_tokens = context, max_input
                    kept = [n for n in (context, max_input, cap + 1 if cap > 0 else 0) if n > 0]
                    assert engine._refused_at(entry) == (min(kept) if kept else 0), (cap, context, max_input)
                    hopeless = [n for n in (max(0, cap), context) if n > 0]
                    limit = min(hopeless) if hopeless else 0
                    long = "hello world " * 400
                    least = entry.tokenizer.length_bound.min_tokens(long)  # type: ignore[union-attr]
                    if limit:
                        engine.refuse_hopeless(entry, "x" * limit)  # no more characters than the limit
                    if limit and least > limit:
                        with pytest.raises(InvalidRequestError, match=f"at most {limit}$"):
                            engine.refuse_hopeless(entry, long)
                    else:
                        engine.refuse_hopeless(entry, long)  # no limit, or one it may fit
    finally:
        engine.close()
