"""Inspection of one prompt against live gateway state, or offline against a worker list.

``Inspector.inspect`` tokenizes exactly as the inference endpoints do (same engine,
same template, same prompt cache), then hands the ids, the pool's worker views, the
live policy and, for ``cache_aware``, its radix tree to the pure
``policies.inspection.inspect_tokens``. ``inspect_offline`` does the same with no
gateway: a fresh ring of the given workers (ids as the gateway derives them,
``host:port``), so the owner shown is the one a gateway with those workers picks.
"""

from __future__ import annotations

from collections.abc import Sequence

from gateway.pipeline.engine import Engine
from gateway.policies.base import Policy, WorkerView
from gateway.policies.cache_aware import CacheAwarePolicy
from gateway.policies.factory import PolicyConfig, close_policy, make_policy
from gateway.policies.inspection import Inspection, inspect_tokens
from gateway.policies.prefix_hash import PrefixHashPolicy
from gateway.policies.ring_policy import RingPolicy
from gateway.protocol.errors import InvalidRequestError
from gateway.protocol.inspect import InspectRequest
from gateway.tokenization import Tokenizer
from gateway.tokenization.errors import ChatTemplateError
from gateway.workers.client import parse_worker_url


def hash_params(policy: Policy | None, config: PolicyConfig, req: InspectRequest) -> tuple[int, int]:
    """(block size, depth tokens): the request's overrides, else the live prefix_hash policy's, else config."""
    if isinstance(policy, PrefixHashPolicy):
        block, depth = policy.block_size, policy.depth_tokens
    else:
        block, depth = config.hash_block_size, config.hash_depth_tokens
    return req.block_size or block, req.depth_tokens or depth


def check_ids(ids: Sequence[int], tokenizer: Tokenizer) -> None:
    vocab = tokenizer.vocab_size
    if any(t < 0 or t >= vocab for t in ids):
        raise InvalidRequestError(f"input_ids must be in [0, {vocab})", param="input_ids")


def render_prompt(tokenizer: Tokenizer, req: InspectRequest) -> tuple[str | None, list[int]]:
    """(rendered text or None, token ids) of the request's prompt, synchronously (offline use)."""
    if req.input_ids is not None:
        check_ids(req.input_ids, tokenizer)
        return None, list(req.input_ids)
    if req.messages is not None:
        try:
            text = tokenizer.apply_chat_template(
                req.template_messages(),
                add_generation_prompt=req.add_generation_prompt,
                chat_template_kwargs=req.chat_template_kwargs,
            )
        except ChatTemplateError as exc:
            raise InvalidRequestError(str(exc), param="messages") from exc
    else:
        text = req.text or ""
    ids = tokenizer.encode(text, req.special_tokens)
    if not ids:
        raise InvalidRequestError("the prompt is empty", param="text")
    return text, ids


def _finish(result: Inspection, req: InspectRequest) -> Inspection:
    if not req.include_tokens:
        result.tokens = []
    return result


class Inspector:
    """Answers inspection requests from a running gateway's engine, router and policy config."""

    def __init__(self, engine: Engine, policy_config: PolicyConfig) -> None:
        self.engine = engine
        self.config = policy_config

    async def tokens(self, req: InspectRequest) -> tuple[str, str | None, list[int]]:
        """(public model name, rendered text or None, ids), tokenized as the inference endpoints do."""
        engine = self.engine
        entry = engine.catalog.get(req.model)
        if req.input_ids is not None:
            check_ids(req.input_ids, entry.tokenizer)
            return entry.name, None, list(req.input_ids)
        if req.messages is not None:
            text, ids = await engine.render_chat(
                entry,
                req.template_messages(),
                tools=None,
                chat_template_kwargs=req.chat_template_kwargs,
                add_generation_prompt=req.add_generation_prompt,
            )
            if req.add_special_tokens:  # the template writes its own special tokens
                ids = await engine.encode(entry, text, add_special_tokens=True)
        else:
            text = req.text or ""
            ids = await engine.encode(entry, text, add_special_tokens=req.special_tokens)
        if not ids:
            raise InvalidRequestError("the prompt is empty", param="text")
        return entry.name, text, ids

    def worker_model(self, public: str) -> str:
        """Policies and pools are keyed by the model name workers report."""
        for worker in self.engine.registry.all():
            if self.engine.catalog.public_name(worker.model) == public:
                return worker.model
        return public

    def views(self, model: str, pool: str) -> list[WorkerView]:
        return [w.view() for w in self.engine.registry.pool(model, pool) if not w.draining]

    async def inspect(self, req: InspectRequest) -> Inspection:
        public, text, ids = await self.tokens(req)
        model = self.worker_model(public)
        views = self.views(model, req.pool)
        policy = self.engine.router.policy(model, req.pool) if views else None
        block, depth = hash_params(policy, self.config, req)
        tree = policy.tree(model) if isinstance(policy, CacheAwarePolicy) else None
        ring = None
        if isinstance(policy, RingPolicy) and policy.ring.virtual_nodes == self.config.virtual_nodes:
            if policy.ring.members == frozenset(v.worker_id for v in views):
                ring = policy.ring  # the live ring itself (a fresh one would be identical, just slower)
        tokenizer = self.engine.catalog.get(public).tokenizer
        result = inspect_tokens(
            ids,
            workers=views,
            block_size=block,
            depth_tokens=depth,
            ring=ring,
            virtual_nodes=self.config.virtual_nodes,
            tree=tree,
            policy=policy,
            pieces=tokenizer.convert_ids_to_tokens(ids) if req.include_tokens else None,
            model=public,
            pool=req.pool,
            source="gateway",
            text=text,
        )
        if views:
            result.quality = {
                **self.engine.router.quality(model, req.pool).snapshot(),
                **(policy.quality() if policy is not None else {}),
            }
        if not views:
            result.notes.append(f"no {req.pool} worker serves model {public!r}")
        elif tree is None:
            result.notes.append(f"policy {policy.name if policy else None} keeps no radix tree: no per-worker cache predictions")
        return _finish(result, req)


def worker_views(urls: Sequence[str]) -> list[WorkerView]:
    """Idle, available views of workers given as ``grpc://host:port`` (or bare ``host:port``)."""
    views = []
    for url in urls:
        full = url if "://" in url else f"grpc://{url}"
        try:
            addr = parse_worker_url(full)
        except ValueError as exc:
            raise InvalidRequestError(f"bad worker url {url!r}: {exc}", param="workers") from exc
        views.append(WorkerView(worker_id=addr.target, url=addr.url))
    return views


def inspect_offline(
    tokenizer: Tokenizer,
    req: InspectRequest,
    worker_urls: Sequence[str],
    config: PolicyConfig,
    *,
    model: str = "",
    with_policy: bool = True,
) -> Inspection:
    """Inspect with no gateway: the ring of ``worker_urls``, all idle; no radix tree.

    With ``with_policy`` the answer includes what a fresh ``config.policy`` would
    choose for these idle workers (ring policies: the ring owner).
    """
    text, ids = render_prompt(tokenizer, req)
    views = worker_views(worker_urls)
    policy = make_policy(config) if with_policy and views else None
    try:
        result = inspect_tokens(
            ids,
            workers=views,
            block_size=req.block_size or config.hash_block_size,
            depth_tokens=req.depth_tokens or config.hash_depth_tokens,
            virtual_nodes=config.virtual_nodes,
            policy=policy,
            pieces=tokenizer.convert_ids_to_tokens(ids) if req.include_tokens else None,
            model=model or tokenizer.name,
            pool=req.pool,
            source="offline",
            text=text,
        )
    finally:
        if policy is not None:
            close_policy(policy)
    if not views:
        result.notes.append("no workers given: no ring position (pass --workers)")
    result.notes.append("offline: no live radix tree, so no per-worker cache predictions (ask a gateway)")
    return _finish(result, req)
