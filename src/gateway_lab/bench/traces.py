"""Public request traces as workloads, and the hit rate a trace allows at best.

Two input formats, told apart line by line:

* Mooncake's (``timestamp`` in ms, ``input_length``, ``output_length``, ``hash_ids``: one
  id per block of ``source_block_tokens``, equal ids meaning equal content and, since the
  ids are chained, an equal prefix up to that block). Each id becomes a fixed run of
  ``block_tokens`` ordinary word tokens drawn from a stream seeded by the id, so equal
  ids give equal token prefixes, the only thing a prefix cache can observe. Lengths are
  scaled by ``block_tokens / source_block_tokens`` and capped: a full-size replay does
  not fit a small machine.
* Alibaba's Qwen-Bailian traces (``qwen_trace*_blksz_16.jsonl``): the same fields plus
  ``chat_id`` / ``parent_chat_id`` / ``turn`` / ``type``, ``hash_ids`` of 16-token blocks
  (``--source-block-tokens 16``) and ``timestamp`` in seconds, told apart by ``chat_id``.
* plain JSONL prompts with a time: ``timestamp`` (ms) or ``t`` (s), one of ``prompt``
  (text), ``prompt_token_ids`` / ``input_ids`` (ids) or ``messages`` (chat), and
  ``max_tokens`` or ``output_length``; the project's own saved traces
  (``workloads.write_trace``) are of this kind.

Times are multiplied by ``time_scale`` (0.25 replays four times faster). The ideal hit
rate of a trace is printed twice: with an unbounded cache (``workloads.ideal_hit_rate``)
and with one shared LRU cache as large as the whole fleet's KV (``bounded_ideal_hit_rate``):
what a router that could pool every worker's memory would reach, the bar for the fleet
actually measured. That LRU figure is a yardstick, not a ceiling: eight separate caches
can beat one shared LRU (a router that keeps one-off prompts away from hot prefixes).
The ceiling is ``optimal_bounded_hit_rate``: the same pooled KV run with offline-optimal
eviction, which no router in front of that much KV can exceed.
"""

from __future__ import annotations

import dataclasses
import heapq
import math
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import xxhash

from gateway.settings import option
from gateway_lab.bench.workloads import RequestSpec, Vocab, Workload, _rng, record_to_spec

MOONCAKE_BLOCK_TOKENS = 512


@dataclass(slots=True)
class TraceConfig:
    """How much of a trace to replay, and how it is scaled to this machine."""

    trace_requests: int = option(2000, "replay the first N requests of the trace (0: all)")
    trace_offset: int = option(0, "skip this many requests first (a later window of the trace, its times rebased)")
    block_tokens: int = option(32, "tokens each trace block becomes (Mooncake: hash_ids blocks)")
    source_block_tokens: int = option(MOONCAKE_BLOCK_TOKENS, "tokens per block in the trace itself")
    max_prompt_tokens: int = option(4096, "cap on each scaled prompt, tokens")
    max_output_tokens: int = option(64, "cap on each scaled output, tokens")
    time_scale: float = option(0.25, "replay time = trace time x this (0: closed loop, no arrival times)")
    trace_seed: int = option(0, "seed of the token runs that stand for block ids")

    def __post_init__(self) -> None:
        if self.block_tokens < 1 or self.source_block_tokens < 1:
            raise ValueError("block sizes must be >= 1")
        if self.max_prompt_tokens < 1 or self.max_output_tokens < 1:
            raise ValueError("length caps must be >= 1")
        if self.time_scale < 0 or self.trace_requests < 0 or self.trace_offset < 0:
            raise ValueError("time_scale, trace_requests and trace_offset must be >= 0")

    @property
    def length_scale(self) -> float:
        return self.block_tokens / self.source_block_tokens


class BlockTokens:
    """Block id -> its fixed run of word tokens (memoized: popular ids repeat a lot)."""

    def __init__(self, vocab: Vocab, block_tokens: int, seed: int = 0) -> None:
        self.vocab = vocab
        self.block_tokens = block_tokens
        self.seed = seed
        self._runs: dict[int, tuple[int, ...]] = {}

    def __call__(self, block_id: int) -> tuple[int, ...]:
        run = self._runs.get(block_id)
        if run is None:
            run = self._runs[block_id] = self.vocab.sample(_rng(self.seed, "block", block_id), self.block_tokens)
        return run


def is_mooncake(record: Mapping[str, Any]) -> bool:
    return "hash_ids" in record


def arrival_seconds(record: Mapping[str, Any]) -> float:
    """A block-hash line's arrival: Mooncake's ``timestamp`` is in ms, Qwen-Bailian's (the
    lines with a ``chat_id``) in seconds."""
    t = float(record["timestamp"])
    return t if "chat_id" in record else t / 1000.0


def is_foreign_trace(path: str | Path) -> bool:
    """Whether the file's first request is in a format of this module (Mooncake's, or a
    ``timestamp`` in ms), rather than the project's own saved workload (``t`` in s)."""
    with Path(path).open("rb") as f:
        for line in f:
            if line.strip():
                try:
                    record = orjson.loads(line)
                except orjson.JSONDecodeError:
                    return False
                return isinstance(record, dict) and ("hash_ids" in record or "timestamp" in record)
    return False


def mooncake_spec(record: Mapping[str, Any], config: TraceConfig, blocks: BlockTokens) -> RequestSpec:
    """One Mooncake (or Qwen-Bailian) line as a completions request over its blocks' token runs."""
    ids = record["hash_ids"]
    if not isinstance(ids, list) or not ids or not all(isinstance(i, int) for i in ids):
        raise ValueError("hash_ids must be a non-empty list of integers")
    length = math.ceil(int(record["input_length"]) * config.length_scale)
    length = max(1, min(length, len(ids) * config.block_tokens, config.max_prompt_tokens))
    tokens: list[int] = []
    for block_id in ids:
        if len(tokens) >= length:
            break
        tokens += blocks(block_id)
    output = math.ceil(int(record.get("output_length", 1)) * config.length_scale)
    return RequestSpec(
        endpoint="completions",
        max_tokens=max(1, min(output, config.max_output_tokens)),
        prompt_token_ids=tuple(tokens[:length]),
        group=f"b{ids[1] if len(ids) > 1 else ids[0]}",
        arrival_s=arrival_seconds(record),
    )


def plain_spec(record: Mapping[str, Any], config: TraceConfig) -> RequestSpec:
    """A JSONL prompt with a time (``timestamp`` ms or ``t`` s) as a request."""
    if "timestamp" in record:
        fields = dict(record)
        fields["t"] = float(fields.pop("timestamp")) / 1000.0
        if "input_ids" in fields:
            fields["prompt_token_ids"] = fields.pop("input_ids")
        if "output_length" in fields:
            fields["max_tokens"] = fields.pop("output_length")
        record = fields
    spec = record_to_spec(record)
    if spec.prompt_token_ids is not None and len(spec.prompt_token_ids) > config.max_prompt_tokens:
        spec = dataclasses.replace(spec, prompt_token_ids=spec.prompt_token_ids[: config.max_prompt_tokens])
    return dataclasses.replace(spec, max_tokens=min(spec.max_tokens, config.max_output_tokens))


def load_trace_workload(path: str | Path, config: TraceConfig, vocab: Vocab) -> Workload:
    """``config.trace_requests`` requests of ``path`` after the first ``config.trace_offset``,
    scaled (see the module doc); times start at the first one replayed."""
    path = Path(path)
    blocks = BlockTokens(vocab, config.block_tokens, config.trace_seed)
    specs: list[RequestSpec] = []
    kinds: set[str] = set()
    skip = config.trace_offset
    with path.open("rb") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            if skip:
                skip -= 1
                continue
            if config.trace_requests and len(specs) >= config.trace_requests:
                break
            try:
                record = orjson.loads(line)
                if not isinstance(record, dict):
                    raise ValueError("each line must be a JSON object")
                if is_mooncake(record):
                    kinds.add("mooncake")
                    spec = mooncake_spec(record, config, blocks)
                else:
                    kinds.add("plain")
                    spec = plain_spec(record, config)
            except (orjson.JSONDecodeError, ValueError, KeyError, TypeError) as exc:
                raise ValueError(f"{path}:{n}: {exc}") from exc
            specs.append(spec)
    if not specs:
        raise ValueError(f"{path}: no requests")
    t0 = min(s.arrival_s or 0.0 for s in specs)
    specs = [
        dataclasses.replace(s, arrival_s=None if config.time_scale == 0 else ((s.arrival_s or 0.0) - t0) * config.time_scale)
        for s in specs
    ]
    params = dataclasses.asdict(config) | {"format": "+".join(sorted(kinds)), "requests": len(specs)}
    return Workload(path.stem, tuple(specs), params)


# ---------------------------------------------------------------------------- ideals


def _page_keys(ids: Sequence[int], page_size: int) -> list[int]:
    """Chained hashes of the whole pages of ``ids``: equal keys mean equal prefixes."""
    keys = []
    h = 0
    for start in range(0, len(ids) - len(ids) % page_size, page_size):
        h = xxhash.xxh3_64_intdigest(orjson.dumps(ids[start : start + page_size]), h)
        keys.append(h)
    return keys


def bounded_ideal_hit_rate(prompts: Iterable[Sequence[int]], page_size: int, capacity_tokens: int) -> float:
    """Hit rate of ONE LRU page cache of ``capacity_tokens`` seeing every prompt in order.

    A prompt hits its leading pages still in the cache; all its pages are then used, the
    deepest first so that a prefix always outlives its extensions. This is the pooled
    fleet: no router can keep more than the fleet's total KV, so a policy measured
    against this figure is measured against what its fleet could hold.
    """
    if page_size < 1 or capacity_tokens < page_size:
        raise ValueError("need page_size >= 1 and capacity_tokens >= page_size")
    cache: OrderedDict[int, None] = OrderedDict()
    limit = capacity_tokens // page_size
    total = cached = 0
    for ids in prompts:
        keys = _page_keys(ids, page_size)
        total += len(ids)
        hit = 0
        for k in keys:
            if k not in cache:
                break
            hit += 1
        cached += hit * page_size
        for k in reversed(keys):  # used pages become the most recent, the prefix last of all
            cache[k] = None
            cache.move_to_end(k)
        while len(cache) > limit:
            cache.popitem(last=False)
    return cached / total if total else 0.0


def optimal_bounded_hit_rate(prompts: Sequence[Sequence[int]], page_size: int, capacity_tokens: int) -> float:
    """Hit rate of one page cache of ``capacity_tokens`` with offline-optimal eviction: a ceiling.

    A worker caches every prompt it serves (its KV must hold the prompt to compute it),
    and evicts whatever it likes later. So the union of a fleet's caches, whose sizes add
    up to ``capacity_tokens``, is one pooled cache of that size that admits every prompt
    when it is served; a request hits on its worker only pages that are in that union.
    Taken in arrival order, the most such a pooled cache can hit is reached by Belady's
    rule at request granularity: admit the prompt's pages, then drop the pages needed
    again furthest in the future (never again: first; ties: the deeper page, so the
    cache stays prefix-closed and a page hit is a prefix hit). Outputs, partial pages
    and running requests take no room here, so a real fleet behind any router only
    falls short of it.
    """
    if page_size < 1 or capacity_tokens < page_size:
        raise ValueError("need page_size >= 1 and capacity_tokens >= page_size")
    keyed = [_page_keys(ids, page_size) for ids in prompts]
    never = math.inf
    nexts: list[list[float]] = []
    last_seen: dict[int, float] = {}
    for i in range(len(keyed) - 1, -1, -1):  # each page's next request, by a backward pass
        nexts.append([last_seen.get(k, never) for k in keyed[i]])
        for k in keyed[i]:
            last_seen[k] = i
    nexts.reverse()
    limit = capacity_tokens // page_size
    cached_next: dict[int, tuple[float, int]] = {}  # page -> (next request using it, depth)
    heap: list[tuple[float, int, int]] = []  # (-next request, -depth, page); stale entries skipped
    total = cached = 0
    for ids, keys, row in zip(prompts, keyed, nexts, strict=True):
        total += len(ids)
        cached += page_size * sum(1 for k in keys if k in cached_next)
        for d, (k, nxt) in enumerate(zip(keys, row, strict=True)):
            cached_next[k] = (nxt, d)
            heapq.heappush(heap, (-nxt, -d, k))
        while len(cached_next) > limit:
            far, deep, victim = heapq.heappop(heap)
            if cached_next.get(victim) == (-far, -deep):
                del cached_next[victim]
    return cached / total if total else 0.0


@dataclass(frozen=True, slots=True)
class TraceIdeals:
    """The best hit rates a trace allows: unbounded, and within the fleet's total KV
    (shared LRU, the yardstick; offline-optimal eviction, the ceiling)."""

    unbounded: float
    fleet_kv: float
    fleet_kv_tokens: int
    fleet_kv_optimal: float = 0.0


def trace_ideals(workload: Workload, page_size: int, fleet_kv_tokens: int) -> TraceIdeals:
    from gateway_lab.bench.workloads import ideal_hit_rate

    prompts = [s.prompt_token_ids for s in workload if s.prompt_token_ids is not None]
    if len(prompts) != len(workload):
        raise ValueError("trace ideals need token-id prompts")
    return TraceIdeals(
        unbounded=ideal_hit_rate(prompts, page_size),
        fleet_kv=bounded_ideal_hit_rate(prompts, page_size, fleet_kv_tokens),
        fleet_kv_tokens=fleet_kv_tokens,
        fleet_kv_optimal=optimal_bounded_hit_rate(prompts, page_size, fleet_kv_tokens),
    )
