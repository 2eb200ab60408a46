"""The request pipeline shared by every front door: prepare -> select -> dispatch.

HTTP and gRPC front doors both call ``Engine``; there is no second copy of
tokenization, routing, retries or load accounting anywhere else.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import math
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from gateway.pipeline.catalog import ModelCatalog, ModelEntry
from gateway.pipeline.dispatch import (
    DispatchConfig,
    Embedded,
    TokenStream,
    WholeAnswer,
    call_embed,
    open_generate,
)
from gateway.pipeline.encoder_build import start_build
from gateway.pipeline.generation import Generation
from gateway.pipeline.journal_stream import JournalStream
from gateway.pipeline.limits import (
    LimitsConfig,
    apply_sampling_limits,
    check_prompt,
    check_prompt_tokens,
    check_response_bytes,
    check_token_ids,
)
from gateway.pipeline.model_facts import apply_model_defaults
from gateway.pipeline.observer import NULL_OBSERVER, PipelineObserver
from gateway.pipeline.pd import PdOpener, serves_pd
from gateway.pipeline.prepared import PreparedRequest
from gateway.pipeline.resume import OpenContinuation, ResumeConfig, Resumer
from gateway.pipeline.retry import RetryConfig
from gateway.pipeline.router import Router
from gateway.pipeline.sampling import to_sampling_params
from gateway.pipeline.template_runner import RenderTimeout, TemplateRunner
from gateway.pipeline.tenancy import salt_prefix
from gateway.policies.base import RouteRequest, build_route_request
from gateway.proto import sglang_scheduler_pb2 as pb
from gateway.protocol.errors import (
    ContextLengthExceededError,
    InvalidRequestError,
    NoWorkerError,
)
from gateway.protocol.ids import random_hex
from gateway.protocol.sampling import SamplingOptions
from gateway.settings import option
from gateway.tokenization import StopPlan, Tokenizer
from gateway.tokenization.errors import ChatTemplateBudgetError, ChatTemplateError
from gateway.tokenization.reply_cache import message_texts
from gateway.tokenization.special_text import SpecialTextShield

log = logging.getLogger(__name__)

StageObserver = Callable[[str, float], None]  # (stage name, seconds)
_NO_EXCLUDE: frozenset[str] = frozenset()  # a first attempt avoids no worker
# Past this many times --offload-chars a text goes to the pool without asking the prompt
# cache what it holds: cutting and walking a text that long would itself hold the event loop.
WALK_CHARS_FACTOR = 16


@dataclass
class EngineConfig:
    tokenize_threads: int = option(2, "threads that tokenize long prompts off the event loop")
    offload_chars: int = option(4096, "prompts longer than this many characters are tokenized in the thread pool")
    encoder_at_load: bool = option(
        True,
        "build a model's tiktoken encoder (exact ids, checked against the HF tokenizer; prompts then encode "
        "several times faster) and its prompt-length bound when the model loads, before it takes traffic: "
        "a few seconds of CPU once per process and tokenizer. Off: lazily, see --fast-encoder-after "
        "(the build's long native calls hold the GIL and stall the requests arriving meanwhile)",
    )
    fast_encoder_after: int = option(
        256,
        "with --no-encoder-at-load: build a model's tiktoken encoder in a background thread at its Nth "
        "tokenized prompt, or at its first prompt longer than --offload-chars if that comes first. "
        "0: only at a long prompt",
    )
    worker_stream_interval: int = option(
        0,
        "tokens per streamed worker chunk the gateway asks for (0: the worker's own default, 1 on SGLang); "
        "each chunk costs the gateway one gRPC read and one SSE event, so N cuts its CPU per token "
        "about N-fold, at the price of output arriving N tokens at a time",
    )
    busy_stream_interval: int = option(
        0,
        "opt-in load-adaptive streaming: when > 1, a streamed request that starts while this gateway "
        "process has --busy-in-flight requests or more on its workers asks its worker for chunks of this "
        "many tokens (fewer gRPC reads and SSE events when the event loop is the bottleneck); below that "
        "load, and when 0 (the default), streams stay one token per event",
    )
    busy_in_flight: int = option(64, "requests in flight (all workers) from which --busy-stream-interval applies")
    chat_template_timeout_s: float = option(
        2.0, "longest a chat template may render, in seconds, before its request fails with a 400 (templates "
        "come from workers: see --chat-template-inline-s for how the event loop is kept free)",
    )
    special_tokens_in_messages: bool = option(
        False, "read special-token strings inside chat messages (contents, tool calls) as special tokens, as "
        "SGLang and vLLM do; off (the default), client text that spells <|im_start|> stays text and cannot "
        "forge a turn (the template's own special tokens are real either way)",
    )
    chat_template_threads: int = option(2, "threads that render chat templates too slow or too large for the event loop")
    chat_template_inline_s: float = option(
        0.05, "a chat template render on the event loop longer than this, in seconds, is stopped and run again "
        "on a template thread, where that template renders from then on",
    )

    def __post_init__(self) -> None:
        if self.worker_stream_interval < 0:
            raise ValueError("worker_stream_interval must be >= 0 (0: the worker's default)")
        if self.busy_stream_interval < 0:
            raise ValueError("busy_stream_interval must be >= 0 (0: off)")
        if self.chat_template_timeout_s <= 0:
            raise ValueError("chat_template_timeout_s must be > 0")
        if not 0 < self.chat_template_inline_s <= self.chat_template_timeout_s:
            raise ValueError("chat_template_inline_s must be > 0 and at most chat_template_timeout_s")
        if self.chat_template_threads < 1:
            raise ValueError("chat_template_threads must be >= 1")
        if self.busy_in_flight < 1:
            raise ValueError("busy_in_flight must be >= 1")
        if self.fast_encoder_after < 0:
            raise ValueError("fast_encoder_after must be >= 0 (0: only at a long prompt)")


def _texts(messages: Sequence[dict[str, Any]]) -> list[str]:
    """The string contents of chat messages (text parts of content lists included)."""
    out: list[str] = []
    for message in messages:
        content = message.get("content")
        if isinstance(content, str):
            out.append(content)
        elif isinstance(content, list):
            out.extend(p["text"] for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
    return out


def _spelled_in_tool_calls(shield: SpecialTextShield, messages: Sequence[dict[str, Any]]) -> bool:
    """Whether any message's tool calls spell a special token (a plain loop: no generator
    per request for the messages that have none)."""
    for m in messages:
        if "tool_calls" in m and shield.spelled_in(repr(m["tool_calls"])):
            return True
    return False


class Engine:
    def __init__(
        self,
        router: Router,
        catalog: ModelCatalog,
        *,
        config: EngineConfig | None = None,
        retry: RetryConfig | None = None,
        dispatch: DispatchConfig | None = None,
        observe_stage: StageObserver | None = None,
        limits: LimitsConfig | None = None,
        observer: PipelineObserver | None = None,
        resume: ResumeConfig | None = None,
    ) -> None:
        self.router = router
        self.registry = router.registry
        self.catalog = catalog
        self.config = config or EngineConfig()
        self.retry = retry or RetryConfig()
        self.dispatch = dispatch or DispatchConfig()
        self.limits = limits or LimitsConfig()
        self.resume = resume or ResumeConfig()
        self._pool = ThreadPoolExecutor(
            max_workers=max(1, self.config.tokenize_threads), thread_name_prefix="tokenize"
        )
        self.templates = TemplateRunner(
            self.config.chat_template_threads, self.config.chat_template_timeout_s,
            inline_timeout_s=self.config.chat_template_inline_s, offload_chars=self.config.offload_chars,
        )
        self._bounding: set[int] = set()  # tokenizers whose length bound is being computed
        self._building: set[int] = set()  # tokenizers whose fast encoder is being built
        self._prompts: dict[int, int] = {}  # tokenized prompts per tokenizer, until its fast encoder is built
        self.observer = observer or NULL_OBSERVER
        self._observe = observe_stage or self.observer.stage
        self.pd = PdOpener(router, retry=self.retry, config=self.dispatch, observer=self.observer)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        self.templates.close()

    # ------------------------------------------------------------- tokenization
    async def _offload(self, size: int, fn: Callable[..., Any], *args: Any) -> Any:
        """Run ``fn`` inline when small, else in the bounded pool (the GIL is released
        inside HF tokenizers, so one huge prompt never stalls the event loop)."""
        if size <= self.config.offload_chars:
            return fn(*args)
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)

    def _size(self, tokenizer: Tokenizer, text: str) -> int:
        """``text``'s weight for ``_offload``: its length, or past ``offload_chars`` when its
        encode is a round trip to the tokenizer helper process
        (``Tokenizer.encodes_elsewhere``), so that the event loop never waits on another process."""
        return self.config.offload_chars + 1 if tokenizer.encodes_elsewhere(text) else len(text)

    def _cached_size(self, entry: ModelEntry, text: str, *, prompt: bool = False, refused_at: int = 0) -> int:
        """``_size`` of a text the prompt cache encodes: a long text counts only the part the
        cache does not hold (``PrefixTokenCache.new_chars``), so a long prompt behind a cached
        shared prefix is encoded inline instead of paying two thread hand-offs for a short encode."""
        limit = self.config.offload_chars
        if len(text) <= limit:
            return self._size(entry.tokenizer, text)
        if len(text) > WALK_CHARS_FACTOR * limit or entry.tokenizer.encodes_elsewhere(text):
            return len(text)  # so long that its cut alone would hold the loop, or a helper process's encode
        return entry.prompt_cache.new_chars(text, prompt=prompt, refused_at=refused_at)

    def _warm_encoder(self, tokenizer: Tokenizer, size: int) -> None:
        """Build a model's tiktoken encoder once, planned in a child process
        (``pipeline.encoder_build``: seconds of CPU, much of it holding the GIL; encodes then cost
        several times less; the tokenize pool stays free for prompts), at its first long prompt or its
        ``fast_encoder_after``-th prompt: a process that serves traffic pays it once, early,
        and one that serves a handful of requests (a test, a probe) never does. Until it is
        ready, and where it does not apply, the HF encoder serves."""
        if tokenizer.fast_bpe_ready:
            return
        key = id(tokenizer)
        if size <= self.config.offload_chars:
            after = self.config.fast_encoder_after
            seen = self._prompts.get(key, 0) + 1
            self._prompts[key] = seen
            if not after or seen < after:
                return
        if key not in self._building:
            self._building.add(key)
            self._prompts.pop(key, None)
            start_build(tokenizer)

    def refuse_hopeless(self, entry: ModelEntry, text: str, *, param: str = "prompt") -> None:
        """Refuse, before the tokenizer runs, a text that has more tokens than could ever be
        served: a safe lower bound from its length (``tokenization.length_bound``) against
        ``--max-prompt-tokens`` and the context length."""
        # The smaller of the two that are set (a plain test: a chat request asks twice).
        cap, context = self.limits.max_prompt_tokens, entry.max_context_length
        limit = cap if cap > 0 and (context <= 0 or cap < context) else context
        if limit <= 0 or len(text) <= limit:  # a token covers at least one character
            return
        tokenizer = entry.tokenizer
        if not tokenizer.length_bound_ready:  # computed in the pool, once; unchecked until then
            if id(tokenizer) not in self._bounding:
                self._bounding.add(id(tokenizer))
                self._pool.submit(lambda: tokenizer.length_bound)
            return
        bound = tokenizer.length_bound
        least = bound.min_tokens(text) if bound is not None else 0
        if least > limit:
            raise InvalidRequestError(
                f"the prompt has at least {least} tokens ({len(text)} characters); this gateway accepts at most {limit}",
                param=param, code="prompt_too_long",
            )

    def _refused_at(self, entry: ModelEntry) -> int:
        """The fewest prompt ids that ``check_prompt_ids`` or ``check_context`` surely refuses
        for ``entry`` (0: no limit): the prompt cache keeps no such prompt."""
        cap = self.limits.max_prompt_tokens
        least = 0
        for n in (entry.max_context_length, entry.max_input_tokens, cap + 1 if cap > 0 else 0):
            if n > 0 and (least == 0 or n < least):
                least = n
        return least

    async def encode(self, entry: ModelEntry, text: str, *, add_special_tokens: bool) -> list[int]:
        self.refuse_hopeless(entry, text)
        started = time.perf_counter()
        ids: list[int] = await self._offload(self._size(entry.tokenizer, text), entry.tokenizer.encode, text, add_special_tokens)
        self._observe("tokenize", time.perf_counter() - started)
        return ids

    async def decode(self, entry: ModelEntry, ids: list[int], *, skip_special_tokens: bool) -> str:
        """``ids`` as text; a list longer than ``offload_chars`` ids is decoded in the pool (a
        client's ``/v1/detokenize`` may send millions: seconds of decoding)."""
        text: str = await self._offload(len(ids), entry.tokenizer.decode, ids, skip_special_tokens)
        return text

    async def encode_prompt(self, entry: ModelEntry, text: str) -> list[int]:
        """A plain-text prompt with the tokenizer's special tokens; repeated prefixes (a
        shared system prompt) come from the prompt cache instead of being re-encoded."""
        self.refuse_hopeless(entry, text)
        self._warm_encoder(entry.tokenizer, len(text))
        started = time.perf_counter()
        size = self._cached_size(entry, text, prompt=True)
        ids: list[int] = await self._offload(size, entry.prompt_cache.encode_prompt, text)
        self._observe("tokenize", time.perf_counter() - started)
        return ids

    async def render_chat(
        self,
        entry: ModelEntry,
        messages: Sequence[dict[str, Any]],
        *,
        tools: Sequence[dict[str, Any]] | None,
        chat_template_kwargs: dict[str, Any] | None,
        add_generation_prompt: bool = True,
        continue_final_message: bool = False,
        cache_salt: str | None = None,
    ) -> tuple[str, list[int]]:
        """Template then tokenize a conversation (the multi-turn cache makes resent history
        cheap; replies this gateway generated for the same ``cache_salt`` come back as their
        generated ids, see ``tokenization.reply_cache``)."""
        started = time.perf_counter()
        # The template only adds text: the messages alone may already be hopeless.
        joined = "".join(_texts(messages))
        self.refuse_hopeless(entry, joined, param="messages")
        if not self.config.special_tokens_in_messages:
            shield = entry.tokenizer.special_text
            if shield.spelled_in(joined) or _spelled_in_tool_calls(shield, messages):
                return await self._render_shielded(
                    entry, shield, messages, started, len(joined), tools=tools,
                    add_generation_prompt=add_generation_prompt, continue_final_message=continue_final_message,
                    chat_template_kwargs=chat_template_kwargs,
                )
        text = await self.render_template(
            entry, messages, size=len(joined), tools=tools, add_generation_prompt=add_generation_prompt,
            continue_final_message=continue_final_message, chat_template_kwargs=chat_template_kwargs,
        )
        rendered = time.perf_counter()
        self._observe("template", rendered - started)
        self.refuse_hopeless(entry, text, param="messages")
        self._warm_encoder(entry.tokenizer, len(text))
        replies = entry.reply_cache
        spans = replies.spans(cache_salt, text, message_texts(messages)) if replies is not None else None
        if spans:
            assert replies is not None
            ids: list[int] = await self._offload(
                self._size(entry.tokenizer, text), replies.encode_spliced, text, spans, entry.prompt_cache.encode
            )
        else:
            refused_at = self._refused_at(entry)
            size = self._cached_size(entry, text, refused_at=refused_at)
            ids = await self._offload(size, entry.prompt_cache.encode, text, refused_at)
        self._observe("tokenize", time.perf_counter() - rendered)
        return text, ids

    async def _render_shielded(
        self, entry: ModelEntry, shield: SpecialTextShield, messages: Sequence[dict[str, Any]], started: float,
        size: int, **options: Any,
    ) -> tuple[str, list[int]]:
        """``render_chat`` for messages that spell special tokens: they stay text
        (``tokenization.special_text``); no prompt or reply cache on this rare path."""
        shielded, originals = shield.shield(messages)
        rendered = await self.render_template(entry, shielded, size=size, **options)
        done = time.perf_counter()
        self._observe("template", done - started)
        self.refuse_hopeless(entry, rendered, param="messages")
        tokenizer = entry.tokenizer
        size = self.config.offload_chars + 1 if tokenizer.merges_elsewhere else len(rendered)  # see ``_size``
        text, ids = await self._offload(
            size, shield.encode, rendered, originals, lambda piece: tokenizer.encode(piece, False)
        )
        self._observe("tokenize", time.perf_counter() - done)
        return text, ids

    async def render_template(
        self, entry: ModelEntry, messages: Sequence[dict[str, Any]], *, size: int = 0, **options: Any
    ) -> str:
        """The model's chat template on ``messages`` (``size``: their characters), with a
        deadline (``pipeline.template_runner``): a template error or an overdue render is a 400."""
        tokenizer = entry.tokenizer
        try:
            if size <= self.templates.offload_chars:
                # Inputs made ready here (no template code runs): a shape the template's memo
                # has seen is answered without the runner, the rest renders under its deadline.
                prepared = tokenizer.prepare_chat_template(messages, **options)
                found = prepared.text
                text: str = found if found is not None else await self.templates.render(id(tokenizer), size, prepared.finish)
            else:
                text = await self.templates.render(id(tokenizer), size, tokenizer.apply_chat_template, messages, **options)
        except ChatTemplateBudgetError as exc:
            log.warning("model %s: the chat template went over its render budget: %s", entry.name, exc)
            raise InvalidRequestError(
                f"{exc}: this model's chat template cannot render these messages", param="messages",
                code="chat_template_budget",
            ) from exc
        except ChatTemplateError as exc:
            raise InvalidRequestError(str(exc), param="messages") from exc
        except RenderTimeout as exc:
            log.warning("model %s: the chat template ran past its %gs deadline; request failed", entry.name, self.templates.timeout_s)
            raise InvalidRequestError(
                f"{exc}: this model's chat template cannot render these messages", param="messages",
                code="chat_template_timeout",
            ) from exc
        return text

    # ------------------------------------------------------------- preparation
    def prepare(
        self,
        entry: ModelEntry,
        prompt_ids: list[int],
        sampling: SamplingOptions,
        *,
        stream: bool,
        request_id: str | None = None,
        prompt_text: str = "",
        routing_key: str | None = None,
        target_worker: str | None = None,
        require_reasoning: bool = False,
        prompt_param: str = "prompt",
        cache_salt: str | None = None,
        prompts: int = 1,
    ) -> PreparedRequest:
        """Check the prompt against the model and settle the stop plan
        (``prompt_param`` names the request field errors about the prompt point at;
        ``cache_salt`` isolates the prompt's cache, see ``pipeline.tenancy``)."""
        self.observer.model_resolved(entry.name)
        # Ids this gateway's tokenizer made from ``prompt_text`` (and replies its workers
        # generated, spliced back by the reply cache) need no range scan (a min and a max over
        # every id): that check is for ids a client sent.
        self.check_prompt_ids(entry, prompt_ids, param="prompt", limit_param=prompt_param, tokenized=bool(prompt_text))
        if cache_salt:
            prompt_ids = salt_prefix(cache_salt, entry.tokenizer) + list(prompt_ids)
        check_token_ids(sampling, entry.tokenizer.vocab_size)
        sampling = apply_model_defaults(sampling, entry.facts.default_sampling)
        limit = entry.max_context_length
        sampling = apply_sampling_limits(
            sampling, self.limits, room=limit - len(prompt_ids) - 1 if limit else None
        )
        self.check_context(entry, len(prompt_ids), sampling.max_new_tokens or 0, param=prompt_param)
        check_response_bytes(sampling, self.limits, prompts=prompts, room=limit - len(prompt_ids) if limit else None)
        plan = StopPlan.build(
            entry.tokenizer,
            stop=list(sampling.stop),
            stop_token_ids=list(sampling.stop_token_ids),
            ignore_eos=sampling.ignore_eos,
            skip_special_tokens=sampling.skip_special_tokens,
            worker_matches_strings=bool(sampling.stop) and self.workers_match_stop_strings(entry),
        )
        return PreparedRequest(
            request_id=request_id or random_hex(),
            model=entry.name,
            prompt_ids=prompt_ids,
            sampling=sampling,
            stop_plan=plan,
            tokenizer=entry.tokenizer,
            stream=stream,
            prompt_text=prompt_text,
            routing_key=routing_key,
            target_worker=target_worker,
            require_reasoning=require_reasoning,
            output_room=limit - len(prompt_ids) if limit else None,
        )

    def workers_match_stop_strings(self, entry: ModelEntry) -> bool:
        """Whether every worker of the model has its own tokenizer, so stop strings can go
        to it as the client sent them (a fleet with any worker that has none keeps the
        gateway-only form: one-token strings as stop ids)."""
        model = self.catalog.worker_model(entry.name)
        workers = [w for w in self.registry.all() if w.model == model]
        return bool(workers) and all(w.info.matches_stop_strings for w in workers)

    def check_prompt_ids(
        self, entry: ModelEntry, prompt_ids: Sequence[int], *, param: str, limit_param: str | None = None,
        tokenized: bool = False,
    ) -> None:
        """The prompt checks every kind of request gets: not empty, ids inside the
        vocabulary (unless ``tokenized``: this gateway's tokenizer made them), within the
        operator's prompt limit (``limit_param`` names the field the limit error points at,
        when it differs)."""
        if not prompt_ids:
            raise InvalidRequestError("the prompt is empty", param=param)
        if not tokenized:
            vocab = entry.tokenizer.vocab_size
            if min(prompt_ids) < 0 or max(prompt_ids) >= vocab:  # C loops, twice the genexpr speed
                raise InvalidRequestError(f"prompt token ids must be in [0, {vocab})", param=param)
        check_prompt(prompt_ids, self.limits, param=limit_param or param)

    @staticmethod
    def check_context(entry: ModelEntry, prompt_tokens: int, wanted: int, *, param: str) -> None:
        """Refuse, before any worker is touched, what SGLang would refuse: a prompt as long
        as the model's context or longer, a prompt plus ``wanted`` new tokens that reaches
        it (the rules of SGLang's own server), and a prompt the workers' schedulers refuse
        (``max_input_tokens``: the context less the scheduler's reserve, or its KV pool)."""
        limit = entry.max_context_length
        Engine._check_context_alone(limit, prompt_tokens, param=param)
        if limit and wanted and prompt_tokens + wanted >= limit:
            raise ContextLengthExceededError(
                f"this model's maximum context length is {limit} tokens; the prompt has "
                f"{prompt_tokens} tokens and {wanted} more were requested",
                param=param,
            )
        inputs = entry.max_input_tokens
        if inputs and prompt_tokens >= inputs:
            raise ContextLengthExceededError(
                f"the prompt has {prompt_tokens} tokens; this model's workers accept prompts of at most "
                f"{inputs - 1} tokens (the context length or KV pool, less the room the server keeps)",
                param=param,
            )

    @staticmethod
    def _check_context_alone(limit: int, prompt_tokens: int, *, param: str) -> None:
        if limit and prompt_tokens >= limit:
            raise ContextLengthExceededError(
                f"the prompt has {prompt_tokens} tokens; this model's maximum context length is {limit} tokens",
                param=param,
            )

    def check_prompt_length(self, entry: ModelEntry, prompt_tokens: int, *, param: str = "prompt") -> None:
        """The prompt checks a token-id prompt's length alone decides, with the errors
        :meth:`prepare` gives a prompt of that many valid ids: ``--max-prompt-tokens``, then
        a prompt as long as the model's context or longer. A front door calls it before any
        per-id work (the body's validation, copies, the vocabulary scan), so a prompt refused
        for its length costs none of that. (The workers' own prompt limit is left to
        ``check_context``: below the context its error depends on the tokens asked for.)"""
        check_prompt_tokens(prompt_tokens, self.limits, param=param)
        self._check_context_alone(entry.max_context_length, prompt_tokens, param=param)

    def route_request(self, prepared: PreparedRequest, pool: str = "regular") -> RouteRequest:
        return build_route_request(  # every RouteRequest field, in its order
            prepared.prompt_ids,  # token_ids
            self.catalog.worker_model(prepared.model),  # model
            pool,  # pool
            prepared.request_id,  # request_id
            prepared.routing_key,  # routing_key
            prepared.target_worker,  # target_worker
            prepared.sampling.max_new_tokens or 0,  # max_new_tokens
            _NO_EXCLUDE,  # exclude
        )

    def prepare_scheduler(
        self, request: pb.GenerateRequest, *, routing_key: str | None = None, target_worker: str | None = None
    ) -> RouteRequest:
        """A raw SGLang ``GenerateRequest`` (the scheduler pass-through relays it as sent):
        the prompt checks of :meth:`prepare`, then its route. The single served model
        is meant (the SGLang API names none)."""
        entry = self.catalog.get(None)
        self.observer.model_resolved(entry.name)
        ids = list(request.tokenized.input_ids)
        self.check_prompt_ids(entry, ids, param="tokenized.input_ids")
        params = request.sampling_params
        wanted = params.max_new_tokens if params.HasField("max_new_tokens") else 0
        self.check_context(entry, len(ids), wanted, param="tokenized.input_ids")
        return RouteRequest(
            token_ids=ids,
            model=self.catalog.worker_model(entry.name),
            request_id=request.request_id,
            routing_key=routing_key,
            target_worker=target_worker,
            max_new_tokens=wanted,
        )

    def prepare_embed(
        self, entry: ModelEntry, ids: list[int], request_id: str, *,
        routing_key: str | None = None, target_worker: str | None = None, param: str = "input",
    ) -> RouteRequest:
        """One tokenized embedding input: the prompt checks, then its route."""
        self.check_prompt_ids(entry, ids, param=param)
        self.check_context(entry, len(ids), 0, param=param)
        return RouteRequest(
            token_ids=ids,
            model=self.catalog.worker_model(entry.name),
            request_id=request_id,
            routing_key=routing_key,
            target_worker=target_worker,
        )

    def generate_request(self, prepared: PreparedRequest) -> pb.GenerateRequest:
        sampling = prepared.sampling
        # A client that does not stream (and needs no early stop here: no stop strings, or
        # a worker that matches them itself) gets its answer whole, as SGLang's own
        # frontends ask for it, when its worker's silence is short enough to judge
        # (``_whole``); else the worker streams in coarse chunks, so the watchdog sees
        # progress and a broken generation resumes from its tokens.
        plan = prepared.stop_plan
        coarse = not (prepared.stream or (plan.stop_strings and not plan.worker_stop_strings))
        logprobs = sampling.logprobs or sampling.logprob_start_len >= 0
        request = pb.GenerateRequest(
            request_id=prepared.request_id,
            sampling_params=to_sampling_params(
                sampling,
                stop_token_ids=prepared.stop_plan.stop_token_ids,
                max_new_tokens=sampling.max_new_tokens,
                stop_strings=prepared.stop_plan.worker_stop_strings,
            ),
            return_logprob=logprobs,
            top_logprobs_num=sampling.top_logprobs if sampling.logprobs else 0,
            logprob_start_len=sampling.logprob_start_len,
            stream=not (coarse and self._whole(prepared, logprobs)),
            require_reasoning=prepared.require_reasoning,
        )
        # Filled in place: a TokenizedInput passed to the constructor is built, then copied,
        # which for a long prompt costs more than building it.
        request.tokenized.input_ids.extend(prepared.prompt_ids)
        if coarse and request.stream:
            request.sampling_params.stream_interval = self.resume.unary_stream_interval
        if prepared.prompt_text:
            request.tokenized.original_text = prepared.prompt_text
        if self.config.worker_stream_interval > 0:
            request.sampling_params.stream_interval = self.config.worker_stream_interval
        elif prepared.stream and self.config.busy_stream_interval > 1 and self.busy():
            request.sampling_params.stream_interval = self.config.busy_stream_interval
        return request

    def _whole(self, prepared: PreparedRequest, logprobs: bool) -> bool:
        """Whether a coarse (not streamed, no stop strings matched here) answer is asked for unstreamed
        (``stream=False``): the worker then sends its GenerateComplete(s) alone.

        Always when it would come as one chunk anyway (capped at ``--unary-stream-interval``
        tokens, one sample, no logprobs): neither progress nor a resume point could come
        before it. Otherwise, with ``--unary-whole-max-s`` above 0, when its token budget is
        known (``max_tokens``, or what the model's context leaves after the prompt): its wait
        then has a deadline from that budget, and a worker unheard for ``--unary-whole-max-s``
        is probed and, silent still, left for another (``dispatch._whole_answer``). Not for a
        model served disaggregated (its halves keep the shared rules)."""
        sampling = prepared.sampling
        cap = sampling.max_new_tokens
        if cap is not None and cap <= self.resume.unary_stream_interval and sampling.n == 1 and not logprobs:
            return True
        if self.resume.unary_whole_max_s <= 0 or not self._answer_budget(prepared):
            return False
        model = self.catalog.worker_model(prepared.model)
        roles = {worker.role for worker in self.registry.all() if worker.model == model}
        return roles == {"regular"}

    @staticmethod
    def _answer_budget(prepared: PreparedRequest) -> int:
        """The most output tokens one sample may get: the client's cap, else what the model's
        context leaves after the prompt (0 when neither is known)."""
        cap = prepared.sampling.max_new_tokens
        return cap if cap is not None else max(0, prepared.output_room or 0)

    def whole_answer(self, budget: int = 0) -> WholeAnswer:
        """How an answer asked for unstreamed is waited for: ``budget`` tokens at most (0: the
        request's ``max_new_tokens``), its worker checked once unheard for ``--unary-whole-max-s``."""
        limit = self.resume.unary_whole_max_s
        return WholeAnswer(budget=budget, check_s=limit if limit > 0 else math.inf)

    def busy(self) -> bool:
        """Whether this process relays enough requests that per-message cost is what limits
        it (the workers' load counters: every open lease, whatever its front door)."""
        limit = self.config.busy_in_flight
        total = 0
        for worker in self.registry.all():
            total += worker.load.in_flight
            if total >= limit:
                return True
        return False

    # ------------------------------------------------------------- dispatch
    async def start(self, prepared: PreparedRequest) -> Generation:
        """Route and send; returns once the worker produced its first message."""
        request = self.generate_request(prepared)
        stream = await self.open(
            self.route_request(prepared),
            request,
            samples=prepared.sampling.n,
            wants_output_logprobs=prepared.sampling.logprobs,
            answer_budget=self._answer_budget(prepared),
        )
        resumer = Resumer(request, self._continuation_opener(prepared), self.resume, prepared.sampling, self.observer)
        return Generation(stream, prepared, resumer)

    async def start_from_journal(self, prepared: PreparedRequest, generated: list[int]) -> Generation:
        """A generation that goes on from ``generated`` (tokens another process journaled
        before it died) through the resume path (``pipeline.journal_stream``)."""
        request = self.generate_request(prepared)
        resumer = Resumer(request, self._continuation_opener(prepared), self.resume, prepared.sampling, self.observer)
        if resumer.refusal is not None:
            raise InvalidRequestError(f"the generation cannot be continued elsewhere: {resumer.refusal}")
        return Generation(JournalStream(generated, len(prepared.prompt_ids), self.observer), prepared, resumer)

    def _continuation_opener(self, prepared: PreparedRequest) -> OpenContinuation:
        """How a broken generation's continuation is opened: the one open path (PD pairs
        re-paired), routed by the policy on the longer prompt (a worker holding its prefix
        is preferred), away from the workers that failed it while anyone else is left."""

        async def open_one(request: pb.GenerateRequest, avoid: frozenset[str]) -> TokenStream:
            ids = list(request.tokenized.input_ids)
            sp = request.sampling_params
            route = RouteRequest(
                token_ids=ids, model=self.catalog.worker_model(prepared.model), request_id=request.request_id,
                routing_key=prepared.routing_key, target_worker=prepared.target_worker,
                max_new_tokens=sp.max_new_tokens if sp.HasField("max_new_tokens") else 0, exclude=avoid,
            )
            try:
                return await self.open(route, request, wants_output_logprobs=prepared.sampling.logprobs)
            except NoWorkerError:
                if not avoid:
                    raise
                # Nobody else is left: a failed worker may take it if its breaker allows.
                route = dataclasses.replace(route, exclude=frozenset())
                return await self.open(route, request, wants_output_logprobs=prepared.sampling.logprobs)

        return open_one

    async def open(
        self,
        route: RouteRequest,
        request: pb.GenerateRequest,
        *,
        samples: int = 1,
        wants_output_logprobs: bool = False,
        answer_budget: int = 0,
    ) -> TokenStream:
        """The one way a generation reaches workers (chat, completions, /generate, the
        gateway's gRPC API and the SGLang pass-through): a prefill/decode pair when the
        model is served disaggregated, else one worker; the one retry loop either way,
        a lease on every worker reached. Returns once the first message arrived.
        ``answer_budget``: the most tokens an answer asked for unstreamed may take (0: its
        ``max_new_tokens``), which sets its deadline (:meth:`whole_answer`)."""
        started = time.perf_counter()
        samples = max(1, samples)
        stream: TokenStream
        if serves_pd(self.registry, route.model):
            stream = await self.pd.open(
                route,
                request,
                samples=samples,
                wants_output_logprobs=wants_output_logprobs,
                prompt_tokens=len(route.token_ids),
                max_new_tokens=route.max_new_tokens,
            )
        else:
            stream = await open_generate(
                self.router,
                route,
                lambda selection: request,
                prompt_tokens=len(route.token_ids),
                max_new_tokens=route.max_new_tokens * samples,
                retry=self.retry,
                config=self.dispatch,
                observer=self.observer,
                whole=self.whole_answer(answer_budget),
            )
        self._observe("first_token", time.perf_counter() - started)
        return stream

    async def embed(self, route: RouteRequest, request: pb.EmbedRequest) -> Embedded:
        """One embedding on one worker, through the same selection, retry loop and lease."""
        return await call_embed(
            self.router, route, request, retry=self.retry, config=self.dispatch, observer=self.observer
        )

    def tokenizer(self, model: str | None) -> Tokenizer:
        return self.catalog.get(model).tokenizer
