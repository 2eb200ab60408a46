"""The models the gateway serves and each one's tokenizer.

A model's tokenizer is resolved once, when its first worker registers: from an
explicit path, the on-disk cache, the worker itself (GetTokenizer, sha256
checked, bounded in size), or the hub when the operator allows it. Loading runs in a thread
so registration never blocks the event loop. The model's limits and sampling defaults are
settled then too, from the model's files and the worker's server arguments
(``pipeline.model_facts``); what GetModelInfo says about the vocabulary and EOS ids is never
used (placeholders on real workers: the tokenizer's own files are the source).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from gateway.parsers.config import ParserConfig
from gateway.pipeline.encoder_build import (
    DEFAULT_MAX_VOCABULARY_ENTRIES,
    build_encoder,
    capped_load_facts,
    parse_in_child,
)
from gateway.pipeline.model_facts import ModelFacts, prompt_limit, resolve_context, resolve_sampling
from gateway.pipeline.model_parsers import settle_model_parsers
from gateway.pipeline.tokenizer_helper import TokenizerHelper
from gateway.protocol.errors import ModelNotFoundError
from gateway.tokenization import ChatPromptCache, ResolvedTokenizer, Tokenizer, TokenizerRegistry
from gateway.tokenization.errors import TokenizationError
from gateway.tokenization.reply_cache import ReplyTokenCache
from gateway.workers.tokenizer_fetch import DEFAULT_MAX_TOKENIZER_BYTES, fetch_tokenizer_zip
from gateway.workers.transport import CallCode, WorkerCallError
from gateway.workers.worker import Worker

if TYPE_CHECKING:
    from tokenizers import Tokenizer as BackendTokenizer

log = logging.getLogger(__name__)


@dataclass
class ModelEntry:
    name: str
    tokenizer: Tokenizer
    tokenizer_source: str
    max_context_length: int  # the model's context length (advertised as max_model_len)
    prompt_cache: ChatPromptCache
    model_type: str = ""
    aliases: set[str] = field(default_factory=set)
    worker_model: str = ""  # the name the workers report, which keys policies and pools
    tool_call_parser: str | None = None  # the model's own tool-call format (gateway.parsers)
    reasoning_parser: str | None = None
    reply_cache: ReplyTokenCache | None = None  # --reply-token-reuse: replies resent as their generated ids
    facts: ModelFacts = field(default_factory=ModelFacts)  # limits and sampling defaults, with their sources
    max_input_tokens: int = 0  # prompts this long or longer are refused by some worker's scheduler (0: unknown)

    @property
    def default_sampling(self) -> dict[str, float]:
        return dict(self.facts.default_sampling)

    def describe(self) -> dict[str, object]:
        """Where each fact the gateway uses about this model comes from."""
        return {
            "name": self.name,
            "tokenizer": self.tokenizer_source,
            "vocab_size": {"value": self.tokenizer.vocab_size, "source": "tokenizer.json"},
            "eos_token_ids": {
                "value": sorted(self.tokenizer.eos_token_ids),
                "source": "tokenizer_config.json, generation_config.json, config.json",
            },
            **self.facts.describe(),
            "max_input_tokens": {"value": self.max_input_tokens, "source": "the workers' schedulers (the lowest)"},
        }


class ModelCatalog:
    def __init__(
        self,
        cache_dir: Path,
        *,
        tokenizer_path: str | None = None,
        served_name: str | None = None,
        prompt_cache_entries: int = 1024,
        parsers: ParserConfig | None = None,
        reply_token_reuse: bool = False,
        reply_cache_entries: int = 4096,
        reply_cache_bytes: int = 64 * 1024 * 1024,
        tokenizer_hub: bool = False,
        max_tokenizer_bytes: int = DEFAULT_MAX_TOKENIZER_BYTES,
        max_vocabulary_entries: int = DEFAULT_MAX_VOCABULARY_ENTRIES,
        warm_encoders: bool = True,
    ) -> None:
        self._warm_encoders = warm_encoders  # build the fast encoder and length bound before traffic
        # Set once the models known at start-up are served (``serve``): the models that join
        # after that have their BPE merges built and used in this helper process, never here.
        self.tokenizer_helper: TokenizerHelper | None = None
        self._parsers = parsers or ParserConfig()
        # The hub fallback downloads the repository a worker names: an outbound fetch a
        # worker could aim, so only when the operator asks for it.
        # tokenizer.json files are read in a child process and the tokenizer rebuilt here
        # from their parts (``encoder_build.parse_in_child``): a model joining a running
        # gateway stalls its event loop for the BPE model's build, not the whole file's parse.
        # A vocabulary past ``max_vocabulary_entries`` is refused before anything builds it.
        self._load_facts = capped_load_facts(max_vocabulary_entries)
        self.registry = TokenizerRegistry(cache_dir, hub_enabled=tokenizer_hub, parse=self._parse)
        self._max_tokenizer_bytes = max_tokenizer_bytes
        self._tokenizer_path = tokenizer_path
        self._served_name = served_name
        self._prompt_cache_entries = prompt_cache_entries
        self._reply_cache = (reply_cache_entries, reply_cache_bytes) if reply_token_reuse else None
        self._entries: dict[str, ModelEntry] = {}
        self._loading: dict[str, asyncio.Task[ModelEntry]] = {}


    def _parse(self, json_file: Path) -> BackendTokenizer:
        """The registry's parse: ``parse_in_child`` with this catalog's vocabulary bound; once
        the helper process is set (a model joining at run time), its vocabulary in tables."""
        return parse_in_child(json_file, self._load_facts, tables=self.tokenizer_helper is not None)

    def names(self) -> list[str]:
        return sorted(self._entries)

    def entries(self) -> list[ModelEntry]:
        return list(self._entries.values())

    def public_name(self, worker_model: str) -> str:
        return self._served_name or worker_model

    def worker_model(self, public: str) -> str:
        """The model name workers report for served model ``public`` (policies, pools
        and the registry are keyed by it; it differs when ``--served-model-name`` is set)."""
        entry = self._entries.get(public)
        if entry is None or not entry.worker_model:
            return public
        return entry.worker_model

    def get(self, name: str | None) -> ModelEntry:
        """The entry for a request's ``model``; with one model served, an empty name means it."""
        if name and name in self._entries:
            return self._entries[name]
        if not name and len(self._entries) == 1:
            return next(iter(self._entries.values()))
        for entry in self._entries.values():
            if name in entry.aliases:
                return entry
        raise ModelNotFoundError(name or "")

    async def ensure(self, worker: Worker) -> ModelEntry:
        """Load the tokenizer for ``worker``'s model unless it is already loaded."""
        name = self.public_name(worker.model)
        entry = self._entries.get(name)
        if entry is not None:
            self._merge_worker_facts(entry, worker)
            return entry
        task = self._loading.get(name)
        if task is None:
            task = asyncio.ensure_future(self._load(name, worker))
            self._loading[name] = task
        try:
            entry = await asyncio.shield(task)
        finally:
            if task.done():
                self._loading.pop(name, None)
        self._entries[name] = entry
        self._merge_worker_facts(entry, worker)
        return entry

    def close(self) -> None:
        """Stop the tokenizer helper process, if one was started."""
        if self.tokenizer_helper is not None:
            self.tokenizer_helper.close()

    def _merge_worker_facts(self, entry: ModelEntry, worker: Worker) -> None:
        """Fold one more worker's facts into its model's: the tightest limits win (a prompt
        must fit every worker it may be routed to); the vocabulary and EOS ids it reports
        are not used."""
        facts = model_facts(entry.tokenizer, worker)
        if not entry.facts.default_sampling and facts.default_sampling:
            entry.facts = dataclasses.replace(
                entry.facts, default_sampling=facts.default_sampling, default_sampling_source=facts.default_sampling_source
            )
        if facts.context_length and (not entry.max_context_length or facts.context_length < entry.max_context_length):
            entry.max_context_length = facts.context_length
            entry.facts = dataclasses.replace(
                entry.facts, context_length=facts.context_length, context_source=facts.context_source
            )
        limit = prompt_limit(
            reported=worker.info.max_req_input_len, context_length=entry.max_context_length,
            kv_pool=worker.info.kv_capacity_tokens or worker.info.kv_pool_tokens,
        )
        if limit and (not entry.max_input_tokens or limit < entry.max_input_tokens):
            entry.max_input_tokens = limit
        entry.aliases.update({worker.model, worker.info.model_path} - {""})

    def _reported_folder(self, model: str, path: str) -> ResolvedTokenizer | None:
        """The tokenizer in the folder a worker reports, if that folder is on this host."""
        return self.registry.resolve_local(model, path) if Path(path).is_dir() else None

    async def _load(self, name: str, worker: Worker) -> ModelEntry:
        model = worker.model
        resolved = await asyncio.to_thread(self.registry.resolve_local, model, self._tokenizer_path)
        if resolved is None:
            try:
                data, sha = await fetch_tokenizer_zip(worker.client, max_bytes=self._max_tokenizer_bytes)
            except Exception as exc:
                log.warning("tokenizer for %s: worker %s could not send it: %s", model, worker.url, exc)
                # Workers that do not serve it at all (SGLang's HTTP server) still say where
                # theirs is: usable when that folder is on this host too (a shared volume).
                # A worker that served a bad one (too large, wrong sha256, unsafe paths) gets
                # no second chance through a local path it names.
                reported = worker.info.tokenizer_path
                unserved = isinstance(exc, WorkerCallError) and exc.code is CallCode.UNIMPLEMENTED
                if reported and unserved:
                    resolved = await asyncio.to_thread(self._reported_folder, model, reported)
                if resolved is None:
                    resolved = await asyncio.to_thread(
                        self.registry.resolve_remote, model, f"worker {worker.url}: {exc}"
                    )
            else:
                resolved = await asyncio.to_thread(self.registry.install_and_load, model, data, sha)
        log.info("tokenizer for %s loaded from %s (%s)", model, resolved.source, resolved.location)
        tokenizer = resolved.tokenizer
        if self._warm_encoders:
            # In a child process, from its files; first, so that the parsers' token look-ups
            # below go through the fast encoder.
            await asyncio.to_thread(build_encoder, tokenizer)
        if self.tokenizer_helper is not None:
            await asyncio.to_thread(self.tokenizer_helper.attach, tokenizer)
            if tokenizer.vocabulary_in_tables and not tokenizer.merges_elsewhere:
                # The helper could not hold it: the whole tokenizer is built here, before traffic.
                log.warning("tokenizer for %s: built in this process, the helper could not hold it", model)
                await asyncio.to_thread(tokenizer.build_merges)
        names = {name, model, worker.info.model_path} - {""}
        chosen = await asyncio.to_thread(
            settle_model_parsers, self._parsers, names, tokenizer, worker.info.model_type
        )
        await asyncio.to_thread(tokenizer.warm_chat_templates)
        await asyncio.to_thread(tokenizer.warm_token_bytes)
        facts = model_facts(tokenizer, worker)
        # Its self-check encodes: a round trip to the helper process for a joined model.
        prompt_cache = await asyncio.to_thread(ChatPromptCache, tokenizer, max_entries=self._prompt_cache_entries)
        log.info(
            "model %s: context length %d (%s), sampling defaults %s (%s)", name, facts.context_length,
            facts.context_source, facts.default_sampling or "none", facts.default_sampling_source,
        )
        return ModelEntry(
            name=name,
            tokenizer=tokenizer,
            tokenizer_source=resolved.source,
            max_context_length=facts.context_length,
            facts=facts,
            prompt_cache=prompt_cache,
            model_type=worker.info.model_type,
            worker_model=model,
            tool_call_parser=chosen.tool_call_parser,
            reasoning_parser=chosen.reasoning_parser,
            reply_cache=ReplyTokenCache(tokenizer, *self._reply_cache) if self._reply_cache else None,
        )


def model_facts(tokenizer: Tokenizer, worker: Worker) -> ModelFacts:
    """One worker's view of its model: its server arguments over the model's files."""
    info = worker.info
    context, context_source = resolve_context(
        context_arg=info.context_length_arg, model_config=tokenizer.model_config,
        tokenizer_limit=tokenizer.model_max_length, kv_pool=info.kv_pool_tokens,
    )
    sampling, sampling_source = resolve_sampling(
        worker_json=info.default_sampling_json, sampling_mode=info.sampling_defaults_mode,
        generation_config=tokenizer.generation_config,
    )
    return ModelFacts(context, context_source, sampling, sampling_source)


__all__ = ["ModelCatalog", "ModelEntry", "TokenizationError", "model_facts"]
