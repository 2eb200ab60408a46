"""Policy configuration (one typed dataclass) and construction by name.

The router builds one policy per worker pool with ``make_policy(config)`` (PD pools
each get their own instance, so the prefill and decode trees never mix).
``explain(policy, request, workers)`` is what ``inspect`` and the admin endpoint call.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from gateway.policies.base import Policy, RouteRequest, WorkerView
from gateway.policies.baselines import (
    P2C_METRICS,
    LeastLoadPolicy,
    PowerOfTwoPolicy,
    RandomPolicy,
    RoundRobinPolicy,
)
from gateway.policies.cache_aware import (
    COST_FORMS,
    DEFAULT_BUDGET_FRACTION,
    DEFAULT_COLD_HASH_SLACK,
    DEFAULT_COLD_SLACK_TOKENS,
    DEFAULT_DECODE_WEIGHT,
    DEFAULT_EVICTION_INTERVAL_S,
    DEFAULT_HOT_PREFIX_MIN_TOKENS,
    DEFAULT_HOT_PREFIX_WINDOW,
    DEFAULT_LOADS_MAX_AGE_S,
    DEFAULT_PREFILL_WEIGHT,
    DEFAULT_REQUEST_WEIGHT,
    DEFAULT_SLOT_STEP_TOKENS,
    DEFAULT_SPREAD_PREFILL_WEIGHT,
    DEFAULT_STICK_QUEUE_TOKENS,
    DEFAULT_STICK_WHOLE_TOKENS,
    CacheAwarePolicy,
    CostKnobs,
)
from gateway.policies.consistent_hash import FALLBACKS, ConsistentHashPolicy
from gateway.policies.key_depth import DEFAULT_MAX_SHARE as DEFAULT_DEPTH_MAX_SHARE
from gateway.policies.key_depth import DEFAULT_MAX_TOKENS as DEFAULT_MAX_DEPTH_TOKENS
from gateway.policies.key_depth import DEFAULT_WINDOW as DEFAULT_DEPTH_WINDOW
from gateway.policies.prefix_hash import (
    DEFAULT_BLOCK_SIZE,
    DEFAULT_DEPTH_TOKENS,
    DEFAULT_LOAD_FACTOR,
    DEFAULT_WARMUP_S,
    PrefixHashPolicy,
)
from gateway.policies.radix_tree import DEFAULT_BUDGET_TOKENS, DEFAULT_MAX_TOTAL_TOKENS
from gateway.policies.ring import DEFAULT_VIRTUAL_NODES
from gateway.settings import option

POLICY_NAMES: tuple[str, ...] = (
    "cache_aware",
    "prefix_hash",
    "consistent_hash",
    "power_of_two",
    "least_load",
    "round_robin",
    "random",
)


@dataclass
class PolicyConfig:
    """How the router picks a worker within a pool."""

    policy: str = option("cache_aware", "routing policy", choices=list(POLICY_NAMES))
    hash_block_size: int = option(DEFAULT_BLOCK_SIZE, "prefix_hash/consistent_hash: tokens per hashed block")
    hash_depth_tokens: int = option(
        DEFAULT_DEPTH_TOKENS, "prefix_hash: prompt tokens (whole blocks, capped by the prompt) that form the ring key"
    )
    hash_max_depth_tokens: int = option(
        DEFAULT_MAX_DEPTH_TOKENS, "prefix_hash: deepest key it may go to when shallower keys are too common"
    )
    hash_depth_window: int = option(
        DEFAULT_DEPTH_WINDOW,
        "prefix_hash: recent requests over which a key's share is measured; a key carrying over "
        "--hash-depth-max-share of them is too common and the key goes deeper (0 = fixed depth)",
    )
    hash_depth_max_share: float = option(
        DEFAULT_DEPTH_MAX_SHARE,
        "prefix_hash: share of the recent requests above which a key says nothing (never below one worker's share)",
    )
    hash_idle_takeover: bool = option(
        True, "prefix_hash: when the chosen worker's running slots are all taken, an idle worker takes the request"
    )
    hash_warmup_s: float = option(
        DEFAULT_WARMUP_S,
        "prefix_hash: for this long after a worker joins, keys seen recently (continuing conversations) stay "
        "where they were and the new worker takes the new keys of its arcs (0 = no warm-up)",
    )
    virtual_nodes: int = option(DEFAULT_VIRTUAL_NODES, "hash ring: virtual nodes per worker")
    load_factor: float = option(
        DEFAULT_LOAD_FACTOR,
        "prefix_hash: a worker above load_factor x the pool's average in-flight load passes "
        "the key on (0 = no bound)",
    )
    tree_budget_fraction: float = option(
        DEFAULT_BUDGET_FRACTION, "cache_aware: each worker's tree budget as a fraction of its KV capacity in tokens"
    )
    tree_default_budget_tokens: int = option(
        DEFAULT_BUDGET_TOKENS, "cache_aware: tree budget of a worker whose KV capacity is unknown"
    )
    tree_max_tokens: int = option(
        DEFAULT_MAX_TOTAL_TOKENS, "cache_aware: global cap on tokens in one tree"
    )
    eviction_interval_s: float = option(
        DEFAULT_EVICTION_INTERVAL_S, "cache_aware: seconds between background LRU eviction passes (0 = evict inline)"
    )
    cost_form: str = option("additive", "cache_aware: cost formula", choices=list(COST_FORMS))
    prefill_weight: float = option(
        DEFAULT_PREFILL_WEIGHT,
        "cache_aware: weight of queued uncached prefill tokens against our own once an offered prefix is hot "
        "(carries more than 1.25 workers' share of the requests)",
    )
    spread_prefill_weight: float = option(
        DEFAULT_SPREAD_PREFILL_WEIGHT,
        "cache_aware: the same weight while no offered prefix carries more than one worker's share "
        "(linear in between; set it to --prefill-weight for a fixed weight)",
    )
    decode_weight: float = option(
        DEFAULT_DECODE_WEIGHT, "cache_aware: weight of running decode tokens, in prefill-token equivalents"
    )
    request_weight: float = option(
        DEFAULT_REQUEST_WEIGHT, "cache_aware: fixed cost of each in-flight request, in tokens"
    )
    slot_step_tokens: float = option(
        DEFAULT_SLOT_STEP_TOKENS, "cache_aware: what one decode step is worth in prefill tokens, for the wait of a request sent to a worker whose running slots (its max_running_requests) are all taken (0: no such term)"
    )
    stick_queue_tokens: float = option(
        DEFAULT_STICK_QUEUE_TOKENS,
        "cache_aware: while no offered prefix is hot, the worker holding the longest match keeps a request "
        "when it has a free running slot and less than this many uncached prefill tokens queued (0 = off: "
        "the cost alone decides)",
    )
    stick_whole_tokens: float = option(
        DEFAULT_STICK_WHOLE_TOKENS,
        "cache_aware: with --stick-queue-tokens, the holder keeps the request only while the prompt tokens "
        "queued on it, counted whole rather than at their estimated uncached part, are fewer than this "
        "(0 = not checked)",
    )
    cold_slack_tokens: float = option(
        DEFAULT_COLD_SLACK_TOKENS,
        "cache_aware: while no offered prefix is hot, a prompt every worker holds equally little of goes, among "
        "the workers costing at most this many tokens more than the cheapest, to the one whose tree share has "
        "room for it, else whose least recently used content is oldest (negative = off: the rotating order)",
    )
    cold_hash_slack: float = option(
        DEFAULT_COLD_HASH_SLACK,
        "cache_aware: a prompt every worker holds equally little of goes, among the workers costing at most this "
        "share of its own prefill more than the cheapest, to the one a hash of its first tokens and the worker ids "
        "ranks first, so replicas that see a new prompt group before they hear of each other's decisions pick the "
        "same worker (negative = off: the rotating order; --cold-slack-tokens wins where it applies)",
    )
    loads_max_age_s: float = option(
        DEFAULT_LOADS_MAX_AGE_S, "cache_aware: ignore polled worker loads older than this"
    )
    use_polled_loads: bool = option(
        True, "cache_aware: poll workers' GetLoads and use num_waiting_uncached_tokens"
    )
    closed_loop: bool = option(
        True, "cache_aware: correct the tree from each finished request's reported cached tokens"
    )
    learn_output: bool = option(
        True, "cache_aware: at a finish, record the output ids behind the prompt on its worker (workers cache them)"
    )
    decode_fill: bool = option(
        True, "cache_aware: count running requests' max_tokens times the share of max_tokens recent requests "
        "really decoded (max_tokens is only an upper bound without ignore_eos)"
    )
    hot_prefix_min_tokens: int = option(
        DEFAULT_HOT_PREFIX_MIN_TOKENS,
        "cache_aware: a shared prefix at least this long carrying over 1.25/n of the requests is held "
        "on ceil(share x n - 1/4 + headroom) workers and spread among them only (0 = no replication)",
    )
    hot_prefix_window: int = option(
        DEFAULT_HOT_PREFIX_WINDOW, "cache_aware: requests over which a prefix's load share is measured (decayed)"
    )
    p2c_metric: str = option(
        "in_flight", "power_of_two: compare in-flight requests or polled token load",
        choices=list(P2C_METRICS),
    )
    consistent_hash_fallback: str = option(
        "prefix", "consistent_hash: routing of requests without a routing key",
        choices=list(FALLBACKS),
    )
    seed: int | None = option(None, "random/power_of_two: RNG seed (unset: nondeterministic)")


def make_policy(config: PolicyConfig | None = None, **overrides: Any) -> Policy:
    """A fresh policy instance for one pool, as ``config`` (plus ``overrides``) describes."""
    cfg = config or PolicyConfig()
    if overrides:
        cfg = dataclasses.replace(cfg, **overrides)
    name = cfg.policy
    if name == "cache_aware":
        return CacheAwarePolicy(
            budget_fraction=cfg.tree_budget_fraction,
            default_budget_tokens=cfg.tree_default_budget_tokens,
            max_tree_tokens=cfg.tree_max_tokens,
            eviction_interval_s=cfg.eviction_interval_s,
            cost=CostKnobs(
                form=cfg.cost_form,
                prefill_weight=cfg.prefill_weight,
                spread_prefill_weight=cfg.spread_prefill_weight,
                decode_weight=cfg.decode_weight,
                request_weight=cfg.request_weight,
                loads_max_age_s=cfg.loads_max_age_s,
                slot_step_tokens=cfg.slot_step_tokens,
                stick_queue_tokens=cfg.stick_queue_tokens,
                stick_whole_tokens=cfg.stick_whole_tokens,
                cold_slack_tokens=cfg.cold_slack_tokens,
                cold_hash_slack=cfg.cold_hash_slack,
            ),
            use_polled_loads=cfg.use_polled_loads,
            closed_loop=cfg.closed_loop,
            learn_output=cfg.learn_output,
            decode_fill=cfg.decode_fill,
            hot_prefix_min_tokens=cfg.hot_prefix_min_tokens,
            hot_prefix_window=cfg.hot_prefix_window,
        )
    if name == "prefix_hash":
        return PrefixHashPolicy(
            block_size=cfg.hash_block_size,
            depth_tokens=cfg.hash_depth_tokens,
            virtual_nodes=cfg.virtual_nodes,
            load_factor=cfg.load_factor,
            max_depth_tokens=cfg.hash_max_depth_tokens,
            depth_window=cfg.hash_depth_window,
            depth_max_share=cfg.hash_depth_max_share,
            idle_takeover=cfg.hash_idle_takeover,
            warmup_s=cfg.hash_warmup_s,
        )
    if name == "consistent_hash":
        return ConsistentHashPolicy(
            virtual_nodes=cfg.virtual_nodes,
            fallback=cfg.consistent_hash_fallback,
            block_size=cfg.hash_block_size,
            depth_tokens=cfg.hash_depth_tokens,
        )
    if name == "power_of_two":
        return PowerOfTwoPolicy(seed=cfg.seed, metric=cfg.p2c_metric)
    if name == "least_load":
        return LeastLoadPolicy()
    if name == "round_robin":
        return RoundRobinPolicy()
    if name == "random":
        return RandomPolicy(seed=cfg.seed)
    raise ValueError(f"unknown policy {name!r}; choose one of {', '.join(POLICY_NAMES)}")


def explain(policy: Policy, request: RouteRequest, workers: Sequence[WorkerView]) -> dict[str, Any]:
    """What ``policy`` would choose for ``request`` and why, per worker, without side effects.

    Always has ``policy`` and ``workers`` (per-worker load figures); a choice adds
    ``choice`` and ``reason`` (or ``error``). ``cache_aware`` adds per-worker
    ``predicted_cached_tokens``, ``cost``, tree tokens and budget; ``prefix_hash`` and
    ``consistent_hash`` add ``ring_position`` and the ``walked`` order.
    """
    return policy.explain(request, workers)


def close_policy(policy: Policy) -> None:
    """Stop a policy's background work (the cache_aware evictor thread), if it has any."""
    policy.close()
