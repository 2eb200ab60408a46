"""``cache_aware``: route to the cheapest worker, counting cached prefixes and queued work in tokens.

A token radix tree (``radix_tree.RadixTree``, one per model; the router makes one
policy instance per pool) remembers which worker was sent which prompt. For a new
prompt of ``P`` tokens the policy walks the prompt's path once and scores every
available worker ``w``::

    c_w  = tokens of the prompt the tree says w holds, rounded down to whole KV
           pages of w.page_size (a 37-token match with 16-token pages counts 32)
    U_w  = P - c_w                                   tokens w would still prefill
    Q_w  = queued prefill tokens ahead of us on w, uncached part only:
           queued_prefill_tokens * (1 - cached/prompt of this policy's in-flight
           requests on w), plus remote_prefill_tokens (the uncached part other
           gateway processes have queued, from sync), plus the part of the worker's polled
           num_waiting_uncached_tokens (when younger than loads_max_age_s) above
           the prompt tokens the gateway has queued there: this process's, and the
           other processes' of its set and replicas (remote_queued_prompt_tokens):
           traffic it did not send. The polled figure is never taken whole: it prices
           queued requests against the cache *as it is*, so in a burst a group's
           queued requests all count as misses until the first is prefilled, and a
           holder would look loaded by a full prompt per queued hit and shed
           its prefix (a ramped gsp lost most of its hits that way in
           ``token-gateway bench policies``). The siblings' part is subtracted for
           the same reason: their queued requests count in remote_prefill_tokens at
           their uncached part already, and taken again at the cache as it is, a
           burst's holders shed their prefixes in a set (or a pair of replicas) that
           one process keeps.
    D_w  = running_decode_tokens (decode tokens still owed by w's running requests)
           times the decode fill: the share of its max_tokens a finished request
           really decoded (decayed over the last ``FILL_WINDOW`` finishes, 1 until
           ``FILL_MIN_SAMPLES``). max_tokens is exact with ignore_eos and an upper
           bound otherwise: clients often send a generous cap (or none, and the gateway
           fills in ``--max-tokens-cap``), and a term counted from caps far above the
           real lengths outweighed every cached prefix (the Zipf closed loop with a
           generous cap lost hits).
    R_w  = in_flight requests

    additive (default):  cost_w = U_w + a * Q_w
                                      + decode_weight * D_w + request_weight * R_w
    a = spread_prefill_weight while no offered prefix is hot, prefill_weight once one is
    multiplicative:      cost_w = (U_w + 1) * (1 + R_w)

and picks the lowest cost (ties: the longer match, then a rotating order).

The weight ``a`` of queued prefill adapts to how concentrated the offered prefixes are
(``HotPrefixes.top_load``: the hottest prefix's share of the recent requests times the
pool size). While no prefix carries more than one worker's fair share, whole prefixes
can be placed so that the pool balances by itself, and a spill buys little balance for
a whole shared prefix recomputed elsewhere: queued prefill counts at
``spread_prefill_weight`` (0.25), so a holder keeps its prefix until its queue is four
times the prefix's worth ahead. A spill is for good: the prefix now lives on two workers,
each copy pushes other prefixes out of a full cache, and the next requests of it (a
conversation's next turns) split between them; at a momentary queue of one or two long
prompts it buys a few milliseconds of one request's wait for that. So while the spread
weight is in force because no offered prefix carries more than one worker's share, the
worker holding the longest match keeps a request the cost would
send away whenever it has room: a free running slot (or no known cap) and less uncached
prefill queued than ``stick_queue_tokens`` (off by default; 4,096, about half a
chunked-prefill step, lets the turn start within a step or so), and, when
``stick_whole_tokens`` is set, fewer queued prompt tokens counted whole than that
(``queued_whole``: the uncached estimate prices a queue at the mean miss share of the
in-flight requests, so one cold cap-length prompt among cached turns could sit ahead of a
kept turn). Past that, or with every slot taken, the cost decides. Under the same condition a cold prompt (every scored worker holds
equally little of it) can be placed by what it would push out rather than by the rotating
order (``cold_slack_tokens``, off by default; ``_coldest``): it trades hit rate between
differently built fleets rather than gaining on both, so it is a knob to measure with.
A cold prompt can instead go where its first tokens hash (``cold_hash_slack``;
``_agreed``): among the workers whose cost is within that share of its own prefill above
the cheapest, the one its rendezvous hash ranks first. Replicas on a bus hear each other's decisions late; two of
them that see a new prompt group at once each found it cold and placed it by their own
(different) load views, so the group began on two workers. The hash is computed from the
prompt and the worker ids alone, so they agree wherever their cheapest sets overlap.
Once one prefix carries more than ``1 + SLACK`` workers' worth, balance needs spills and replicas: it counts at ``prefill_weight`` (1.0),
linearly in between; the full weight until 16 requests have shown how spread the
traffic is (so a prefix that turns out hot is not piled up in the first moments of a
burst), and always with hot-prefix tracking off. The full weight is for one hot prefix
among cold ones: when nearly all the traffic is on hot prefixes (``HotPrefixes.cold_share``
below 0.25; 0.5 and up keeps the rule above, linear in between), each prefix gets its own
replica set sized to its load and those sets balance the pool, so the spread weight holds
(8 system prompts on 16 workers: 1.0 scattered each over several workers). Measured
with ``token-gateway bench policies sim``: uniform gsp and the conversation trace keep
their prefixes at the spread weight, and Zipf keeps 1.0's behaviour exactly (a fixed low
weight alone piled requests onto the hot holders).

Every term of the additive form is in tokens, so a cached prefix is worth exactly the
prefill it saves and is weighed against the work already queued, with no on/off
threshold. The multiplicative form (uncached prefill times batch size, as some
routers do) is kept for comparison; ``token-gateway bench policies`` measures both.

Why this shape, against the failure modes a cache-aware router can have:

* One hot worker taking a whole popular prefix while others idle: its queued
  prefill and decode count against it token for token, so once the prefill it
  saves (``c_w``) is smaller than the extra work queued on it, the prefix spills
  to another worker, which then holds it too.
* A cache miss sending everything to the emptiest tree: on a miss ``U_w = P`` for
  everyone and the choice is purely by load; tree size never enters the cost.
* A new worker never warming up: with no tree presence it still wins whenever
  the others' queued work outweighs what their caches save.
* Unbounded memory: per-worker budgets of ``kv_capacity_tokens * budget_fraction``
  (``default_budget_tokens`` when capacity is unknown), a global cap, LRU eviction
  in a background thread (``eviction_interval_s``; inline when 0) with an inline
  hard bound (see ``radix_tree``).
* Decision time growing with the tree or the pool: the walk follows only the
  prompt's path and per-worker work is a constant-time load formula.

Reasons: ``cache_hit`` (the chosen worker has the longest cached match),
``load_balanced`` (some worker had a longer match but load outweighed it),
``cache_miss_balanced`` (the tree knows part of the prompt, but no available worker
holds a whole page of it: chosen by load), ``no_match`` (nothing of the prompt is in
the tree: chosen by load), ``target_worker`` (explicit target).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import xxhash

from gateway.policies.base import (
    Decision,
    NoWorkerAvailable,
    RemoteDecision,
    RemoteEvent,
    RemoteExtension,
    RouteRequest,
    WorkerView,
    build_decision,
)
from gateway.policies.common import TARGET_REASON, BasePolicy, candidates
from gateway.policies.hot_prefix import DEFAULT_WINDOW, SLACK, HotPrefixes
from gateway.policies.radix_tree import (
    DEFAULT_BUDGET_TOKENS,
    DEFAULT_MAX_TOTAL_TOKENS,
    Mark,
    RadixTree,
    pack,
)

COST_FORMS = ("additive", "multiplicative")
# Defaults, shared with factory.PolicyConfig (tuned with token-gateway bench policies tune).
DEFAULT_BUDGET_FRACTION = 1.0
DEFAULT_EVICTION_INTERVAL_S = 0.5
DEFAULT_EVICTION_LOW_WATERMARK = 1.0  # background passes evict an over-budget share down to this fraction
DEFAULT_PREFILL_WEIGHT = 1.0
DEFAULT_SPREAD_PREFILL_WEIGHT = 0.25
DEFAULT_DECODE_WEIGHT = 0.5
DEFAULT_REQUEST_WEIGHT = 16.0
DEFAULT_LOADS_MAX_AGE_S = 5.0
DEFAULT_SLOT_STEP_TOKENS = 0.0  # off: see docs/policies.md, "Slot wait"
DEFAULT_STICK_QUEUE_TOKENS = 0.0  # off: see docs/policies.md, "A holder with room keeps the turn"
DEFAULT_STICK_WHOLE_TOKENS = 0.0  # not checked: see docs/policies.md, "A holder with room keeps the turn"
DEFAULT_COLD_SLACK_TOKENS = -1.0  # off; see docs/policies.md, "A cold prompt evicts the oldest content"
DEFAULT_COLD_HASH_SLACK = -1.0  # off; see docs/policies.md, "Replicas agree on a cold prompt"
COLD_KEY_TOKENS = 64  # a cold prompt's hash covers what every worker holds of it plus this many tokens
DEFAULT_HOT_PREFIX_MIN_TOKENS = 256
DEFAULT_HOT_PREFIX_WINDOW = DEFAULT_WINDOW
FILL_WINDOW = 256  # finished requests over which the decode fill (decoded / max_tokens) is measured
FILL_MIN_SAMPLES = 16  # finishes before the fill is trusted (until then 1: max_tokens taken as the length)
HOT_KEY_BLOCK = 16  # a hot-prefix key covers whole blocks of this many tokens of the longest match
HOT_REASON = "hot_prefix"  # spread among the hot prefix's replica set
HOT_NEW_REASON = "hot_prefix_new_replica"  # the replica set grows by this (cheapest non-holder) worker
HOT_OVERFLOW_REASON = "hot_prefix_overflow"  # every holder's slots were taken: the whole pool was scored
# Below a cold share (traffic not on hot prefixes) of COLD_SHARE_LO the spread weight holds,
# above COLD_SHARE_LO + COLD_SHARE_SPAN the hot-prefix rule does, linear in between.
COLD_SHARE_LO = 0.25
COLD_SHARE_SPAN = 0.25
_MAX_TRACKED = 1 << 16  # in-flight requests remembered for the queue estimate


@dataclass(frozen=True, slots=True)
class CostKnobs:
    """The cost formula's weights (see the module docstring)."""

    form: str = "additive"
    prefill_weight: float = DEFAULT_PREFILL_WEIGHT  # a once a prefix is hot
    spread_prefill_weight: float = DEFAULT_SPREAD_PREFILL_WEIGHT  # a while none is (= prefill_weight: fixed)
    decode_weight: float = DEFAULT_DECODE_WEIGHT
    request_weight: float = DEFAULT_REQUEST_WEIGHT
    loads_max_age_s: float = DEFAULT_LOADS_MAX_AGE_S
    slot_step_tokens: float = DEFAULT_SLOT_STEP_TOKENS  # S_w: one decode step in prefill tokens (0: off)
    stick_queue_tokens: float = DEFAULT_STICK_QUEUE_TOKENS  # a holder with a free slot and less queued keeps it (0: off)
    stick_whole_tokens: float = DEFAULT_STICK_WHOLE_TOKENS  # ... and fewer whole prompt tokens queued (0: not checked)
    cold_slack_tokens: float = DEFAULT_COLD_SLACK_TOKENS  # a cold prompt evicts the oldest content within this cost (<0: off)
    cold_hash_slack: float = DEFAULT_COLD_HASH_SLACK  # a cold prompt goes where it hashes within this share of its prefill (<0: off)

    def __post_init__(self) -> None:
        if self.form not in COST_FORMS:
            raise ValueError(f"cost form must be one of {COST_FORMS}, not {self.form!r}")
        if self.prefill_weight < 0 or self.spread_prefill_weight < 0:
            raise ValueError("prefill weights must be >= 0")
        if self.stick_queue_tokens < 0 or self.stick_whole_tokens < 0:
            raise ValueError("stick_queue_tokens and stick_whole_tokens must be >= 0")


@dataclass(slots=True)
class PredictionStats:
    """How well the tree's predictions matched what workers reported on finish."""

    finished: int = 0
    predicted_tokens: int = 0
    reported_tokens: int = 0
    prompt_tokens: int = 0
    under_predicted: int = 0  # finishes that reported fewer cached tokens than predicted
    over_predicted: int = 0  # finishes that reported more (a copy we did not route there)
    corrected_tokens: int = 0  # tree tokens dropped by those corrections
    learned_tokens: int = 0  # tree tokens added from reports above the prediction
    worker_resets: int = 0  # a worker's page size or KV capacity changed: its tree share was dropped


class _Evictor(threading.Thread):
    """Background thread that trims over-budget trees every ``interval`` seconds.

    A tree that took no insert and no budget change since its last look (``version``)
    cannot have gone over budget, so it is skipped without a scan. A pass evicts in
    ``RadixTree.evict``'s short locked chunks, down to the tree's low watermark.
    """

    def __init__(self, policy: CacheAwarePolicy, interval: float) -> None:
        super().__init__(name="cache-aware-evictor", daemon=True)
        self._policy = policy
        self._interval = interval
        self.stop = threading.Event()
        self.passes = 0  # trees evicted for (tests and benchmarks read it)
        self.evicted = 0  # nodes evicted
        self._seen: dict[int, int] = {}  # id(tree) -> its version when last found within budget

    def run(self) -> None:
        while not self.stop.wait(self._interval):
            self.sweep()

    def sweep(self) -> int:
        """One wake-up: evict for every tree that changed and is over budget; nodes evicted."""
        done = 0
        for tree in self._policy.trees():
            version = tree.version
            if self._seen.get(id(tree)) == version:
                continue
            if tree.over_budget():
                self.passes += 1
                done += tree.evict()
            if not tree.over_budget():
                self._seen[id(tree)] = version
        self.evicted += done
        return done


class CacheAwarePolicy(BasePolicy):
    name: str = "cache_aware"

    def __init__(
        self,
        *,
        budget_fraction: float = DEFAULT_BUDGET_FRACTION,
        default_budget_tokens: int = DEFAULT_BUDGET_TOKENS,
        max_tree_tokens: int = DEFAULT_MAX_TOTAL_TOKENS,
        eviction_interval_s: float = DEFAULT_EVICTION_INTERVAL_S,
        eviction_low_watermark: float = DEFAULT_EVICTION_LOW_WATERMARK,
        cost: CostKnobs | None = None,
        use_polled_loads: bool = True,
        closed_loop: bool = True,
        learn_output: bool = True,
        decode_fill: bool = True,
        hot_prefix_min_tokens: int = DEFAULT_HOT_PREFIX_MIN_TOKENS,
        hot_prefix_window: int = DEFAULT_HOT_PREFIX_WINDOW,
    ) -> None:
        if not 0 < budget_fraction <= 4:
            raise ValueError("budget_fraction must be in (0, 4]")
        self.budget_fraction = budget_fraction
        self.default_budget_tokens = default_budget_tokens
        self.max_tree_tokens = max_tree_tokens
        self.eviction_interval_s = eviction_interval_s
        self.eviction_low_watermark = eviction_low_watermark
        self.cost = cost or CostKnobs()
        self.needs_loads = use_polled_loads
        self.stats = PredictionStats()
        self._trees: dict[str, RadixTree] = {}
        self._params: dict[str, tuple[int, int]] = {}  # worker -> (budget, page) registered
        self._caps: dict[str, tuple[int, int]] = {}  # worker -> (kv capacity, page) it reported
        self.load_only: set[str] = set()  # models routed by load alone (tokenizer-fidelity guard)
        self._turn = 0
        self._memo: tuple[RouteRequest | None, bytes] = (None, b"")
        self.closed_loop = closed_loop
        self.learn_output = learn_output
        self.learn_decode_fill = decode_fill
        self.hot_prefix_min_tokens = max(0, hot_prefix_min_tokens)
        self.hot = HotPrefixes(window=hot_prefix_window)

        self._hot_memo: tuple[RouteRequest | None, int | None] = (None, None)
        # request key -> (worker, prompt tokens, predicted cached, tree clock after its insert)
        self._inflight: OrderedDict[object, tuple[str, int, int, int]] = OrderedDict()
        self._sums: dict[str, list[int]] = {}  # worker -> [prompt tokens, predicted cached]
        self._miss: dict[str, float] = {}  # worker -> 1 - cached/prompt of its tracked requests
        self.decode_fill = 1.0  # decoded / max_tokens of recent finishes: scales D_w (see the module docstring)
        self._fill: list[float] = [0.0, 0.0, 0.0]  # decayed decoded tokens, decayed max_tokens, finishes seen
        self._evictor: _Evictor | None = None
        self._lock = threading.Lock()  # guards _trees creation against the evictor's listing

    # ------------------------------------------------------------------ trees
    def tree(self, model: str = "") -> RadixTree:
        """The tree for ``model`` (created on first use)."""
        tree = self._trees.get(model)
        if tree is None:
            tree = RadixTree(
                default_budget_tokens=self.default_budget_tokens,
                max_total_tokens=self.max_tree_tokens,
                evict_inline=self.eviction_interval_s <= 0,
                low_watermark=self.eviction_low_watermark,
            )
            for wid, (budget, page) in self._params.items():
                tree.set_worker(wid, budget_tokens=budget, page_size=page)
            with self._lock:
                self._trees[model] = tree
            if self.eviction_interval_s > 0 and self._evictor is None:
                self._evictor = _Evictor(self, self.eviction_interval_s)
                self._evictor.start()
        return tree

    def trees(self) -> list[RadixTree]:
        with self._lock:
            return list(self._trees.values())

    def budget_for(self, w: WorkerView) -> int:
        if w.kv_capacity_tokens > 0:
            return max(1, int(w.kv_capacity_tokens * self.budget_fraction))
        return self.default_budget_tokens

    def quality(self) -> dict[str, Any]:
        """The closed-loop corrections, hot prefixes, queue weight, decode fill and
        load-only models (``/metrics`` and ``inspect`` show them)."""
        stats = self.stats
        out: dict[str, Any] = {
            "under_predicted": stats.under_predicted,
            "over_predicted": stats.over_predicted,
            "corrected_tokens": stats.corrected_tokens,
            "learned_tokens": stats.learned_tokens,
            "worker_resets": stats.worker_resets,
        }
        hot, size = self.hot, max(1, len(self._params))
        out["hot_prefixes"] = [
            {"key": f"{key:016x}", "share": round(share, 4), "replicas": hot.replicas(key, len(self._params)),
             "holders": holders}
            for key, share, holders in hot.hot(size)[:16]
        ]
        # how concentrated the offered prefixes are, and the queue weight that follows from it
        load = hot.top_load(size)
        out["hottest_prefix_load"] = None if load is None else round(load, 3)
        # the share of the traffic not on hot prefixes: below 0.5 the replica sets balance
        # the pool, and hot prefixes get no headroom replicas (see hot_prefix)
        out["cold_share"] = round(hot.cold_share(), 3)
        out["queued_prefill_weight"] = round(self.queued_prefill_weight(size), 3)
        # how much of the running requests' max_tokens the decode term counts (1: exact lengths)
        out["decode_fill"] = round(self.decode_fill, 4)
        out["load_only_models"] = sorted(self.load_only)
        return out

    def set_load_only(self, model: str, on: bool) -> None:
        """Route ``model`` by load alone (its prompts are not the token sequences its workers
        cache, see ``quality.FidelityGuard``) or by cache and load again."""
        if on:
            self.load_only.add(model)
        else:
            self.load_only.discard(model)

    def _register(self, w: WorkerView) -> None:
        caps = (w.kv_capacity_tokens, max(1, w.page_size))
        old = self._caps.get(w.worker_id)
        if old != caps:
            self._caps[w.worker_id] = caps
            if old is not None and old[0] > 0 and caps[0] > 0:
                # A known page size or KV capacity changed: the worker restarted with other
                # settings, its cache is not what the tree says. Forget its share; it routes
                # by load until the tree has learned it again.
                self.stats.worker_resets += 1
                for tree in self.trees():
                    if tree.has_worker(w.worker_id):
                        tree.remove_worker(w.worker_id)
                self._params.pop(w.worker_id, None)
        params = (self.budget_for(w), max(1, w.page_size))
        if self._params.get(w.worker_id) != params:
            self._params[w.worker_id] = params
            for tree in self.trees():
                tree.set_worker(w.worker_id, budget_tokens=params[0], page_size=params[1])

    def packed(self, request: RouteRequest) -> bytes:
        """The prompt as packed uint32 tokens (memoized for the request being routed)."""
        return self._packed(request)

    def _packed(self, request: RouteRequest) -> bytes:
        req, pb = self._memo
        if req is not request:
            pb = pack(request.token_ids)
            self._memo = (request, pb)
        return pb

    # --------------------------------------------------------------- choosing
    def select(self, request: RouteRequest, workers: Sequence[WorkerView]) -> Decision:
        if request.target_worker:
            return super().select(request, workers)
        if request.model in self.load_only:
            matched: tuple[int, dict[str, int]] = (0, {})
            hot = None
        else:
            matched = self._match(request, workers)  # one walk for the hot-prefix key and the scores
            hot = self._hot_pool(request, workers, matched) if self.hot_prefix_min_tokens else None
        # Filtering is fused into the scoring loop (one pass over the pool, not two).
        scored = self._score(request, hot[0] if hot else workers, self._turn, None, matched, slot_aware=hot is not None,
                             pool_size=len(workers))
        if scored is None:
            candidates(request, workers)  # raises the right NoWorkerAvailable
            raise NoWorkerAvailable(f"no worker in pool {request.pool!r}")
        best, reason, cached, scores = scored
        self._turn += 1
        self._register(best)
        return build_decision(best.worker_id, hot[1] if hot else reason, cached, scores)

    def queued_prefill_weight(self, pool_size: int) -> float:
        """``a``, the weight of queued prefill now (see the module docstring): the spread
        weight while no offered prefix is hot, the full weight once one carries more than
        ``1 + SLACK`` workers' worth, linear in between; the full weight while too few
        requests have been seen to tell, and when hot prefixes are not tracked
        (``hot_prefix_min_tokens`` 0)."""
        hi, lo = self.cost.prefill_weight, self.cost.spread_prefill_weight
        if hi == lo or not self.hot_prefix_min_tokens:
            return hi  # fixed, or no prefix shares are tracked to tell
        load = self.hot.top_load(pool_size)
        if load is None:
            return hi  # no evidence yet that the traffic is spread: balance first
        f = (load - 1.0) / SLACK
        if f > 0:
            # Nearly all traffic on hot prefixes: each gets its own replica set sized to its
            # load, and those sets balance the pool; a full weight would only scatter every
            # prefix over more workers than its set (see the module docstring).
            f *= min(1.0, max(0.0, (self.hot.cold_share() - COLD_SHARE_LO) / COLD_SHARE_SPAN))
        return lo if f <= 0 else (hi if f >= 1 else lo + (hi - lo) * f)

    # ----------------------------------------------------------- hot prefixes
    def _hot_key(self, request: RouteRequest, found: int | None = None) -> int | None:
        """The prompt's shared prefix as a key: its longest match (``found``, whoever holds
        it) in whole 16-token blocks, when at least ``hot_prefix_min_tokens`` long.

        Remembered for the request, so ``on_dispatch`` counts the key it was routed on.
        """
        req, key = self._hot_memo
        if req is request and found is None:
            return key
        if found is None:
            found = self._match(request, ())[0]
        key = self._prefix_key(self._packed(request), found)
        self._hot_memo = (request, key)
        return key

    def _prefix_key(self, packed: bytes, found: int) -> int | None:
        """The hot-prefix key of a packed prompt whose longest tree match is ``found``
        tokens: its first whole ``HOT_KEY_BLOCK`` blocks, hashed; None when too short."""
        found -= found % HOT_KEY_BLOCK
        if found < self.hot_prefix_min_tokens or found <= 0:
            return None
        return xxhash.xxh3_64_intdigest(memoryview(packed)[: found << 2])

    def _hot_pool(
        self, request: RouteRequest, workers: Sequence[WorkerView], matched: tuple[int, dict[str, int]]
    ) -> tuple[list[WorkerView], str] | None:
        """(the workers a hot prefix's request may go to, reason), or None when not hot.

        ``k`` holders serve the prefix (``HotPrefixes.replicas``). With ``k`` of them
        available the request goes to the cheapest of them only; with fewer, to the
        cheapest non-holder, which joins the set, when the prefix is hot beyond
        sampling luck (``HotPrefixes.surely_hot``) or the cost says the holders are
        busier: the cheapest non-holder costs less than the cheapest holder, the prefix
        a holder saves counted (else the cheapest holder gets it). A share read as hot
        from a few requests' luck (as many uniform groups as workers) then adds no holder
        while the holders are no busier than the rest. Before the first holder is
        known the whole pool is scored as usual. See ``hot_prefix``.
        """
        key = self._hot_key(request, matched[0])
        if key is None:
            return None
        usable = [w for w in workers if w.available and w.worker_id not in request.exclude]
        k = self.hot.replicas(key, len(usable))
        if k < 2:
            return None
        by_id = {w.worker_id: w for w in usable}
        holders = [by_id[h] for h in self.hot.holders(key) if h in by_id][:k]
        if len(holders) < k:
            if not holders:
                return None
            held = {w.worker_id for w in holders}
            others = [w for w in usable if w.worker_id not in held]
            if not self.hot.surely_hot(key, len(usable)) and not self._replica_needed(
                request, holders, others, matched, len(workers)
            ):
                return holders, HOT_REASON
            return others, HOT_NEW_REASON
        if (
            self.cost.slot_step_tokens
            and all(0 < w.max_running_requests <= w.in_flight for w in holders)
            and any(w.in_flight < w.max_running_requests for w in usable)
        ):
            # Every holder's running slots are taken while another worker has a free one:
            # the request would queue for a slot behind the prefix's own traffic. Let the
            # whole pool's cost (slot wait included) decide; a non-holder that wins joins
            # the set (``on_dispatch``). In a burst every worker is full: no overflow.
            return usable, HOT_OVERFLOW_REASON
        return holders, HOT_REASON

    def _replica_needed(
        self, request: RouteRequest, holders: list[WorkerView], others: list[WorkerView],
        matched: tuple[int, dict[str, int]], pool_size: int,
    ) -> bool:  # fmt: skip
        """Whether the cheapest non-holder costs less than the cheapest holder (a new
        replica relieves busier holders, rather than recomputing the prefix for nothing)."""
        mine = self._score(request, holders, self._turn, None, matched, slot_aware=True, pool_size=pool_size)
        theirs = self._score(request, others, self._turn, None, matched, slot_aware=True, pool_size=pool_size)
        if mine is None or theirs is None:
            return theirs is not None
        return theirs[3][theirs[0].worker_id] < mine[3][mine[0].worker_id]

    def _choose(self, request: RouteRequest, cands: list[WorkerView]) -> Decision:
        scored = self._score(request, cands, self._turn, None)
        assert scored is not None  # cands is never empty
        best, reason, cached, scores = scored
        self._turn += 1
        self._register(best)
        return Decision(best.worker_id, reason, cached, scores)

    def _match(self, request: RouteRequest, workers: Sequence[WorkerView]) -> tuple[int, dict[str, int]]:
        """(longest match of the prompt, tokens of it each worker holds): the tree's guess.

        The one place the policy learns what workers cache; the evaluation-only oracle
        (``oracle.OraclePolicy``) overrides it with the workers' true caches.
        """
        return self.tree(request.model).match_packed(self._packed(request))

    def _remember(self, request: RouteRequest, packed: bytes, worker_id: str) -> None:
        """Record that ``worker_id`` will cache this prompt (the tree's half of on_dispatch).

        Only its whole KV pages: a paged worker keeps no partial last page (SGLang frees
        it when the request ends), and matches are counted in whole pages anyway. A tree
        that also claimed each prompt's partial tail counted up to a page per prompt more
        than the worker holds, so it reached the worker's budget first and evicted
        histories the worker still had (their next turns then went elsewhere)."""
        tree = self.tree(request.model)
        page = tree.page_size(worker_id)
        if page > 1:
            packed = packed[: ((len(packed) >> 2) // page * page) << 2]
        tree.insert_packed(packed, worker_id)

    def _predict_cached(self, request: RouteRequest, worker: WorkerView) -> int:
        self._register(worker)
        _, raw = self._match(request, [worker])
        c = raw.get(worker.worker_id, 0)
        return c - c % max(1, worker.page_size)

    def queued_uncached(self, w: WorkerView) -> float:
        """Q_w: the uncached part of the prefill queued on ``w`` (see the module docstring)."""
        q: float = w.queued_prefill_tokens
        if q:
            q *= self._miss.get(w.worker_id, 1.0)
        q += w.remote_prefill_tokens
        lo = w.loads
        if lo is not None and lo.age_s <= self.cost.loads_max_age_s:
            foreign = lo.num_waiting_uncached_tokens - w.queued_prefill_tokens - w.remote_queued_prompt_tokens
            if foreign > 0:
                q += foreign
        return q

    def queued_whole(self, w: WorkerView) -> float:
        """The prompt tokens queued on ``w`` counted whole, not at their estimated uncached
        part: this process's and the other processes' sent prompts with no first token yet,
        plus the polled waiting tokens nobody here sent (the worker reports those uncached
        only). ``Q_w`` prices a queue at the in-flight requests' mean miss share, so a cold
        cap-length prompt queued among cached turns reads as a fraction of itself; this
        count cannot hide it (``stick_whole_tokens``)."""
        q: float = w.queued_prefill_tokens + w.remote_queued_prompt_tokens
        lo = w.loads
        if lo is not None and lo.age_s <= self.cost.loads_max_age_s:
            foreign = lo.num_waiting_uncached_tokens - w.queued_prefill_tokens - w.remote_queued_prompt_tokens
            if foreign > 0:
                q += foreign
        return q

    def _score(
        self,
        request: RouteRequest,
        workers: Sequence[WorkerView],
        turn: int,
        rows: dict[str, dict[str, Any]] | None,
        matched: tuple[int, dict[str, int]] | None = None,
        *,
        slot_aware: bool = False,
        pool_size: int | None = None,
    ) -> tuple[WorkerView, str, int, dict[str, float]] | None:
        """(best worker, reason, its predicted cached tokens, costs of the finalists).

        One pass over the pool with the load terms inlined: per worker it is a few
        attribute reads and a dict lookup, so decision time is the prompt's tree walk
        plus a small constant per worker. None when no worker is available.
        """
        found, raw = matched if matched is not None else self._match(request, workers)
        prompt = len(request.token_ids)
        knobs = self.cost
        additive = knobs.form == "additive"
        a = self.queued_prefill_weight(len(workers) if pool_size is None else pool_size)
        fill = self.decode_fill
        b, r, max_age = knobs.decode_weight * fill, knobs.request_weight, knobs.loads_max_age_s
        slot = knobs.slot_step_tokens if slot_aware else 0.0
        miss = self._miss
        exclude = request.exclude
        n = len(workers)
        if n == 0:
            return None
        start = turn % n
        order = [*workers[start:], *workers[:start]] if start else workers
        best: WorkerView | None = None
        best_cost = float("inf")
        best_c = -1
        longest = 0
        scores: dict[str, float] = {}
        # A holder with room keeps the turn (see the module docstring): only while no offered
        # prefix carries more than one worker's share (not when the spread weight holds because
        # nearly all traffic is hot), never within a hot prefix's replica set (``slot_aware``).
        stick = knobs.stick_queue_tokens
        cold = knobs.cold_slack_tokens  # the same condition for placing a cold prompt by what it evicts
        if (stick or cold >= 0) and additive and not slot_aware and knobs.prefill_weight != knobs.spread_prefill_weight == a:
            top = self.hot.top_load(len(workers) if pool_size is None else pool_size)
            if top is None or top > 1.0:
                stick, cold = 0.0, -1.0
        else:
            stick, cold = 0.0, -1.0
        holder: WorkerView | None = None  # the cheapest worker with the longest match
        hold_c, hold_cost, hold_q = 0, 0.0, 0.0
        shortest = prompt + 1  # the shortest match among the scored workers
        agree = knobs.cold_hash_slack if additive and not slot_aware else -1.0
        pool: list[tuple[float, int, WorkerView]] | None = [] if cold >= 0 or agree >= 0 else None
        for w in order:
            if not w.available:
                continue
            wid = w.worker_id
            if exclude and wid in exclude:
                continue
            c = raw.get(wid, 0) if raw else 0
            if c:
                ps = w.page_size
                if ps > 1:
                    c -= c % ps
                if c > longest:
                    longest = c
            if additive:
                q: float = w.queued_prefill_tokens
                if q:
                    q *= miss.get(wid, 1.0)
                q += w.remote_prefill_tokens
                lo = w.loads
                if lo is not None and lo.age_s <= max_age:
                    foreign = lo.num_waiting_uncached_tokens - w.queued_prefill_tokens - w.remote_queued_prompt_tokens
                    if foreign > 0:  # queued work this gateway did not send (see Q_w)
                        q += foreign
                cost = prompt - c + a * q + b * w.running_decode_tokens + r * w.in_flight
                if stick and c and (c > hold_c or (c == hold_c and cost < hold_cost)):
                    holder, hold_c, hold_cost, hold_q = w, c, cost, q
                cap = w.max_running_requests
                if cap and slot and w.in_flight >= cap:
                    # S_w: every running slot is taken; we wait for (in_flight + 1 - cap)
                    # of them to free, about 2 * avg remaining decode / (cap + 1) steps each.
                    cost += slot * 2.0 / (cap + 1) * (w.in_flight + 1 - cap) * (w.running_decode_tokens * fill / cap)
            else:
                cost = (prompt - c + 1) * (1 + w.in_flight)
            if c:
                scores[wid] = cost
            if pool is not None:
                pool.append((cost, c, w))
                if c < shortest:
                    shortest = c
            if cost < best_cost or (cost == best_cost and c > best_c):
                best, best_cost, best_c = w, cost, c
            if rows is not None:
                rows[wid] = {
                    "predicted_cached_tokens": c,
                    "raw_match_tokens": raw.get(wid, 0),
                    "uncached_tokens": prompt - c,
                    "queued_uncached_estimate": round(self.queued_uncached(w), 1),
                    "cost": cost,
                }
        if best is None:
            return None
        if holder is not None and best_c < hold_c and hold_q < stick and (
            not holder.max_running_requests or holder.in_flight < holder.max_running_requests
        ) and (not knobs.stick_whole_tokens or self.queued_whole(holder) < knobs.stick_whole_tokens):
            best, best_cost, best_c = holder, hold_cost, hold_c
        elif pool and shortest == longest:
            if cold >= 0:
                best_cost, best_c, best = self._coldest(request, pool, best_cost + cold, prompt - best_c)
            else:
                best_cost, best_c, best = self._agreed(request, pool, best_cost + agree * (prompt - best_c), longest)
        scores[best.worker_id] = best_cost
        if found == 0:
            reason = "no_match"
        elif longest == 0:
            reason = "cache_miss_balanced"
        elif best_c == longest:
            reason = "cache_hit"
        else:
            reason = "load_balanced"
        return best, reason, best_c, scores

    def _coldest(
        self, request: RouteRequest, pool: list[tuple[float, int, WorkerView]], limit: float, need: int
    ) -> tuple[float, int, WorkerView]:
        """A cold prompt (every scored worker holds as much of it) costs the same prefill
        anywhere; what differs is what it pushes out. Among the workers costing at most
        ``limit``, the one whose tree share has room for its ``need`` uncached tokens
        (the most room first), else the one whose least recently used content is oldest:
        the content one cache pooling the workers' memory would give up. Ties keep the
        pool's rotating order."""
        tree = self.tree(request.model)
        clock = tree.clock
        pick: tuple[float, int, WorkerView] | None = None
        pick_key: tuple[int, int] = (2, 0)
        for entry in pool:
            if entry[0] > limit:
                continue
            wid = entry[2].worker_id
            room = tree.worker_budget(wid) - tree.worker_tokens(wid)
            if room >= need:
                key = (0, -room)
            else:
                stamp = tree.lru_stamp(wid)
                key = (1, clock if stamp is None else stamp)
            if key < pick_key:
                pick, pick_key = entry, key
        assert pick is not None  # the cheapest worker is always within the limit
        return pick

    def _agreed(
        self, request: RouteRequest, pool: list[tuple[float, int, WorkerView]], limit: float, common: int
    ) -> tuple[float, int, WorkerView]:
        """A cold prompt (every scored worker holds ``common`` tokens of it) goes, among the
        workers costing at most ``limit``, to the one its rendezvous hash ranks first: the
        hash of the prompt's first ``common + COLD_KEY_TOKENS`` tokens seeds a hash of each
        worker's id. Another replica that sees the same prompt group before it hears of this
        decision computes the same ranking, whatever its load view, so both pick the same
        worker whenever it is within the slack in both views."""
        pb = self._packed(request)
        end = min(len(pb) >> 2, common + COLD_KEY_TOKENS)
        seed = xxhash.xxh3_64_intdigest(memoryview(pb)[: end << 2])
        pick = pool[0]
        top = -1
        for entry in pool:
            if entry[0] > limit:
                continue
            rank = xxhash.xxh3_64_intdigest(entry[2].worker_id.encode(), seed)
            if rank > top:
                pick, top = entry, rank
        return pick

    def _explain_candidates(self, request: RouteRequest, cands: list[WorkerView]) -> dict[str, Any]:
        rows: dict[str, dict[str, Any]] = {}
        scored = self._score(request, cands, self._turn, rows)
        assert scored is not None  # cands is never empty
        best, reason, cached, _ = scored
        matched = self._match(request, cands)
        found = matched[0]
        hot = self._hot_pool(request, cands, matched) if self.hot_prefix_min_tokens else None
        key = self._hot_key(request, found) if self.hot_prefix_min_tokens else None
        if hot is not None:
            hot_scored = self._score(request, hot[0], self._turn, None)
            assert hot_scored is not None
            best, reason, cached = hot_scored[0], hot[1], hot_scored[2]
        return {
            "choice": best.worker_id,
            "reason": reason,
            "hot_prefix": None if key is None else {
                "share": round(self.hot.share(key), 4),
                "replicas": self.hot.replicas(key, len(cands)),
                "holders": self.hot.holders(key),
            },
            "predicted_cached_tokens": cached,
            "prompt_tokens": len(request.token_ids),
            "tree_match_tokens": found,
            "cost_form": self.cost.form,
            "scores": rows,
        }

    def explain(self, request: RouteRequest, workers: Sequence[WorkerView]) -> dict[str, Any]:
        out = super().explain(request, workers)
        for wid, row in out.pop("scores", {}).items():
            out["workers"][wid].update(row)
        tree = self.tree(request.model)
        for wid, row in out["workers"].items():
            row["tree_tokens"] = tree.worker_tokens(wid)
            row["tree_budget"] = tree.worker_budget(wid)
        return out

    # ------------------------------------------------------------------ hooks
    def on_dispatch(self, request: RouteRequest, decision: Decision) -> None:
        """The worker will cache this prompt: record it in the tree and in the queue estimate."""
        pb = self._packed(request)
        if self.hot_prefix_min_tokens and decision.reason != TARGET_REASON:
            hk = self._hot_key(request)  # before the insert: the match it was routed on
            n = max(1, len(self._params))
            self.hot.observe(hk, n)  # None too: a request seen (``HotPrefixes.top_load``)
            if hk is not None and self.hot.replicas(hk, n) >= 2:
                self.hot.add_holder(hk, decision.worker_id)
        self._remember(request, pb, decision.worker_id)
        key = request.request_id or id(request)
        if key in self._inflight:
            self._forget(key)
        prompt = len(pb) >> 2
        cached = min(decision.predicted_cached_tokens, prompt)
        self._inflight[key] = (decision.worker_id, prompt, cached, self.tree(request.model).clock)
        s = self._sums.setdefault(decision.worker_id, [0, 0])
        s[0] += prompt
        s[1] += cached
        self._miss[decision.worker_id] = 1.0 - s[1] / s[0] if s[0] else 1.0
        if len(self._inflight) > _MAX_TRACKED:
            self._forget(next(iter(self._inflight)))

    def on_finish(
        self, request: RouteRequest, worker_id: str, cached_tokens: int, success: bool
    ) -> None:
        """Update the queue estimate and prediction stats; correct the tree (closed loop).

        On success the worker reported how much of the prompt it found cached. Less
        than the tree predicted: it had evicted the rest, so its stale claims past the
        reported depth are dropped (``RadixTree.correct``). More: it held a copy we
        did not route there (another replica's traffic, a warm start), which the tree
        now records. A failure teaches nothing about the cache.
        """
        entry = self._forget(request.request_id or id(request))
        if entry is not None and success:
            st = self.stats
            st.finished += 1
            st.predicted_tokens += entry[2]
            st.reported_tokens += cached_tokens
            st.prompt_tokens += entry[1]
            if self.closed_loop and entry[0] == worker_id:
                self._learn(request, worker_id, cached_tokens, entry[2], entry[3])

    def on_decoded(self, request: RouteRequest, completion_tokens: int) -> None:
        """A finished request decoded ``completion_tokens`` of its ``max_new_tokens``: the
        decode fill (``decode_fill``, how much of the running requests' max_tokens the
        decode term counts) follows the recent finishes. Exact lengths (ignore_eos) keep it
        at exactly 1."""
        cap = request.max_new_tokens
        if cap <= 0 or not self.learn_decode_fill:
            return
        f = self._fill
        keep = 1.0 - 1.0 / FILL_WINDOW
        f[0] = f[0] * keep + min(max(0, completion_tokens), cap)
        f[1] = f[1] * keep + cap
        f[2] += 1
        if f[2] >= FILL_MIN_SAMPLES:
            self.decode_fill = f[0] / f[1]

    def on_output(self, request: RouteRequest, worker_id: str, output_ids: Sequence[int]) -> None:
        """A finished request's output: the worker keeps prompt + output cached (SGLang and
        the simulated worker do, in whole pages), so the next chat turn, which carries the
        reply as these very ids (``tokenization.reply_cache``), is predicted to hit there.
        Its length also feeds the decode fill (``on_decoded``)."""
        self.on_decoded(request, len(output_ids))
        if not self.learn_output or not output_ids:
            return
        tree = self.tree(request.model)
        if not tree.has_worker(worker_id):
            return
        page = max(tree.page_size(worker_id), 1)
        whole = (len(request.token_ids) + len(output_ids)) // page * page
        if whole <= len(request.token_ids):
            return
        tree.insert_packed(self._packed(request) + pack(output_ids[: whole - len(request.token_ids)]), worker_id)

    def on_remote(self, event: RemoteEvent) -> object:
        """Another gateway process dispatched a prompt: the worker will cache it, exactly as
        if this process had sent it (the tree's half of ``on_dispatch``). Its load reaches
        the cost through ``WorkerView`` (the sync layer adds remote load to the views);
        remote finishes carry nothing the tree needs. Workers outside the pool are skipped.

        A decision (not a learned output, which carries no prompt count) also counts in the
        hot-prefix tracker, keyed as its sender keyed it (the prompt's longest match before
        the insert), so every replica measures the fleet's prefix shares: a replica that saw
        only its own half of the traffic needed twice the requests before it trusted a share
        (``queued_prefill_weight``'s guard), and in those first moments spilled groups to new
        holders at the full weight (``token-gateway bench policies sim --replicas 2``). A
        remote decision's worker does not join this process's replica set of a hot prefix:
        two replicas growing one shared set at once each kept its own newest holder among
        its first ``k`` and used more holders than either set alone (simulated Zipf and hot
        gsp, 0.3 points lower, more spread).

        Returns a mark (the tree and the node the sequence ended at) that the decision's
        learned output, a ``RemoteExtension``, carries back: the output is then inserted
        from that node (``RadixTree.extend``) instead of walking the prompt again, with the
        same result as inserting the whole sequence, which is what happens when the mark
        went stale (evicted, removed) or there is none."""
        if type(event) is RemoteExtension:
            mark = event.mark
            if mark is not None and event.worker_id in self._params:
                marked: tuple[RadixTree, Mark] = mark  # type: ignore[assignment]  # what this method returned
                out = marked[0].extend(marked[1], event.tokens, event.worker_id)
                if out is not None:
                    return marked[0], out[1]
            event = RemoteDecision(event.worker_id, event.model, event.full)  # no prompt count: not observed
        if type(event) is RemoteDecision and event.worker_id in self._params and event.tokens:
            tree = self.tree(event.model)
            if self.hot_prefix_min_tokens and event.prompt_tokens > 0:
                self._observe_remote(tree, event)
            end = tree.insert_mark(event.tokens, event.worker_id)[1]
            return None if end is None else (tree, end)
        return None

    def _observe_remote(self, tree: RadixTree, event: RemoteDecision) -> None:
        pb = event.tokens
        if len(pb) > event.prompt_tokens << 2:
            pb = pb[: event.prompt_tokens << 2]
        key = self._prefix_key(pb, tree.match_packed(pb)[0])
        self.hot.observe(key, max(1, len(self._params)))

    def _learn(self, request: RouteRequest, worker_id: str, reported: int, predicted: int, stamp: int) -> None:
        """Bring the tree in line with what ``worker_id`` reported (see ``on_finish``)."""
        tree = self.tree(request.model)
        if not tree.has_worker(worker_id):
            return
        page = tree.page_size(worker_id)
        if reported < predicted and predicted - reported >= page:
            self.stats.under_predicted += 1
            self.stats.corrected_tokens += tree.correct(self._packed(request), worker_id, reported, stamp)
        elif reported > predicted and reported - predicted >= page:
            self.stats.over_predicted += 1
            pb = self._packed(request)
            depth = min(reported, len(pb) >> 2)
            self.stats.learned_tokens += tree.insert_packed(pb[: depth << 2], worker_id)

    def _forget(self, key: object) -> tuple[str, int, int, int] | None:
        entry = self._inflight.pop(key, None)
        if entry is not None:
            s = self._sums.get(entry[0])
            if s is not None:
                s[0] -= entry[1]
                s[1] -= entry[2]
                if s[0] <= 0:
                    del self._sums[entry[0]]
                    self._miss.pop(entry[0], None)
                else:
                    self._miss[entry[0]] = 1.0 - s[1] / s[0]
        return entry

    def on_workers_changed(self, workers: Sequence[WorkerView]) -> None:
        """Drop departed workers from every tree; refresh budgets and page sizes."""
        present = {w.worker_id for w in workers}
        gone = [w for w in self._params if w not in present]
        for wid in gone:
            del self._params[wid]
            self._caps.pop(wid, None)
        self.hot.drop_workers(gone)
        for tree in self.trees():
            for wid in tree.workers():
                if wid not in present:
                    tree.remove_worker(wid)
        for key in [k for k, e in self._inflight.items() if e[0] not in present]:
            self._forget(key)
        for w in workers:
            self._register(w)

    def close(self) -> None:
        ev, self._evictor = self._evictor, None
        if ev is not None:
            ev.stop.set()
            ev.join(timeout=2.0)
