"""Prefix-cache hit rate of a multi-turn agent workload: chained through the Responses
API's ``previous_response_id`` against the same turns sent as chat messages.

An agent keeps one long set of instructions (shared by every conversation) and goes
through several turns per task: each turn adds a user message and gets a reply. Sent as
chat, each turn resends the whole history, and the gateway's reply-token reuse turns a
resent reply back into the ids it was generated as. Sent through Responses, the gateway
rebuilds the history from its store (the replies with their generated ids) and only the
new input travels. Both modes get the same seeds, so on a faithful path they send the
same prompts and the two hit rates agree; the ideal (an unbounded shared cache, whole
KV pages, each turn's output cached after it) is computed from each run's transcript.

Every (fleet, mode) cell gets a cold fleet and a fresh in-process gateway. Two fleet
builds, so no figure rests on one worker build: the simulator over gRPC (page 16) and
the simulator speaking SGLang's HTTP API (``/generate`` with token ids, page 32).
``token-gateway bench agent-turns [--conversations 16] [--turns 6] [--markdown FILE]``
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import random
import tempfile
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from gateway.pipeline.offpath import run_pending
from gateway.server.config import GatewayConfig, ServerConfig
from gateway_lab.bench import launch, results
from gateway_lab.bench import workloads as wl
from gateway_lab.bench.inprocess import serve_in_process
from gateway_lab.sim.config import SimConfig

FLEETS = {"sim": 16, "sglang-http": 32}  # fleet build -> KV page size
MODES = ("chat", "responses")


@dataclass(slots=True)
class Turns:
    """The workload's shape."""

    conversations: int = 16
    turns: int = 6
    instructions_tokens: int = 512
    task_tokens: int = 128
    user_tokens: int = 48
    reply_tokens: int = 64
    concurrency: int = 8
    seed: int = 0


@dataclass(slots=True)
class Cell:
    fleet: str
    mode: str
    requests: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    ideal: float = 0.0
    wall_s: float = 0.0
    misses: dict[str, int] = field(default_factory=dict)  # prompt tokens missed, by cause (``policies.miss_causes``)
    transcripts: list[list[dict[str, str]]] = field(default_factory=list, repr=False)  # per conversation
    reply_counts: list[list[int]] = field(default_factory=list, repr=False)

    @property
    def hit(self) -> float:
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0


def texts(shape: Turns, vocab: wl.Vocab) -> tuple[str, list[list[str]]]:
    """The shared instructions, and each conversation's user messages (its task first)."""
    rng = random.Random(f"{shape.seed}:agent")
    instructions = vocab.decode(vocab.sample(rng, shape.instructions_tokens)).lstrip()
    users = []
    for _ in range(shape.conversations):
        task = vocab.decode(vocab.sample(rng, shape.task_tokens)).lstrip()
        users.append([task] + [vocab.decode(vocab.sample(rng, shape.user_tokens)).lstrip() for _ in range(shape.turns - 1)])
    return instructions, users


async def one_conversation(client: Any, model: str, mode: str, shape: Turns, c: int, instructions: str, users: list[str], cell: Cell) -> None:
    messages: list[dict[str, str]] = [{"role": "system", "content": instructions}]
    counts: list[int] = []
    prev: str | None = None
    for t, text in enumerate(users):
        seed = shape.seed * 100_000 + 100 * c + t
        messages.append({"role": "user", "content": text})
        if mode == "chat":
            out = await client.chat.completions.create(model=model, messages=messages, max_tokens=shape.reply_tokens, seed=seed)
            reply, usage = out.choices[0].message.content or "", out.usage
            prompt, cached, made = usage.prompt_tokens, (usage.prompt_tokens_details.cached_tokens or 0), usage.completion_tokens
        else:
            out = await client.responses.create(model=model, instructions=instructions, input=text, previous_response_id=prev,
                                                max_output_tokens=shape.reply_tokens, extra_body={"seed": seed})
            prev, reply, usage = out.id, out.output_text, out.usage
            prompt, cached, made = usage.input_tokens, usage.input_tokens_details.cached_tokens, usage.output_tokens
        messages.append({"role": "assistant", "content": reply})
        counts.append(made)
        cell.requests += 1
        cell.prompt_tokens += prompt
        cell.cached_tokens += cached
    cell.transcripts[c] = messages
    cell.reply_counts[c] = counts


@contextlib.asynccontextmanager
async def fleet_urls(fleet: str, workers: int, sim: SimConfig) -> AsyncIterator[list[str]]:
    """The simulator over gRPC (``sim``) or speaking SGLang's HTTP API, in this process."""
    if fleet == "sim":
        async with launch.fleet("sim", workers, sim) as grpc_fleet:
            yield grpc_fleet.urls
    else:
        async with launch.fleet("http", workers, sim, api="sglang") as http_workers:
            yield http_workers.urls


async def run_cell(fleet: str, mode: str, shape: Turns, args: argparse.Namespace, vocab: wl.Vocab, scratch: str) -> Cell:
    import openai

    sim = SimConfig(page_size=FLEETS[fleet], report_page_size=True, kv_capacity_tokens=args.kv_tokens, eos_probability=0.0,
                    step_base_s=0.0, prefill_token_s=0.0, decode_seq_s=0.0, time_scale=0.0)
    cell = Cell(fleet, mode, transcripts=[[] for _ in range(shape.conversations)], reply_counts=[[] for _ in range(shape.conversations)])
    instructions, users = texts(shape, vocab)
    async with fleet_urls(fleet, args.workers, sim) as urls:
        config = GatewayConfig(server=ServerConfig(worker_urls=urls, tokenizer_cache_dir=scratch, log_level="warning"))
        config.policy.policy = args.policy
        config.history.history_backend = "memory"
        async with serve_in_process(config) as gw:
            client = openai.AsyncOpenAI(base_url=gw.url + "/v1", api_key="none", max_retries=0, timeout=120)
            model = gw.state.catalog.names()[0]
            gate = asyncio.Semaphore(shape.concurrency)

            async def conversation(c: int) -> None:
                async with gate:
                    await one_conversation(client, model, mode, shape, c, instructions, users[c], cell)

            started = time.perf_counter()
            try:
                await asyncio.gather(*(conversation(c) for c in range(shape.conversations)))
            finally:
                await client.close()
            cell.wall_s = time.perf_counter() - started
            run_pending()
            for (_, pool), q in gw.state.router.qualities().items():
                if pool == "regular":
                    snap = q.misses.snapshot()
                    cell.misses = {k: v["tokens"] for k, v in snap.items() if not k.startswith("_") and v.get("tokens")}
    cell.ideal = ideal(cell, FLEETS[fleet])
    return cell


def ideal(cell: Cell, page_size: int) -> float:
    """The transcript's ideal hit rate with reply-token reuse (``workloads.ideal_hit_rate``)."""
    prompts: list[list[dict[str, str]]] = []
    replies: list[str] = []
    counts: list[int] = []
    for messages, made in zip(cell.transcripts, cell.reply_counts, strict=True):
        for t in range(len(made)):
            prompts.append(messages[: 2 + 2 * t])  # system, then user/assistant pairs, ending on turn t's user
            replies.append(messages[2 + 2 * t]["content"])
            counts.append(made[t])
    ids, after = wl.render_chat_prompts(prompts, replies=replies, reply_tokens=counts)
    return wl.ideal_hit_rate(ids, page_size, cached_after=after)


HEADER = ["fleet", "mode", "requests", "prompt tokens", "cached", "hit", "ideal", "missed tokens by cause", "wall s"]


def row(cell: Cell) -> list[str]:
    causes = ", ".join(f"{k} {n:,}" for k, n in sorted(cell.misses.items(), key=lambda kv: -kv[1])) or "-"
    return [cell.fleet, cell.mode, str(cell.requests), f"{cell.prompt_tokens:,}", f"{cell.cached_tokens:,}",
            f"{cell.hit:.3f}", f"{cell.ideal:.3f}", causes, f"{cell.wall_s:.1f}"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The scenario's flags (``token-gateway bench NAME --help``)."""
    parser.add_argument("--conversations", type=int, default=16)
    parser.add_argument("--turns", type=int, default=6)
    parser.add_argument("--instructions-tokens", type=int, default=512, help="tokens of the instructions every conversation shares")
    parser.add_argument("--task-tokens", type=int, default=128, help="tokens of each conversation's first user message")
    parser.add_argument("--user-tokens", type=int, default=48, help="tokens of each later user message")
    parser.add_argument("--reply-tokens", type=int, default=64, help="tokens of each reply")
    parser.add_argument("--concurrency", type=int, default=8, help="conversations in flight at once")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--policy", default="cache_aware")
    parser.add_argument("--kv-tokens", type=int, default=65536, help="KV pool per worker, tokens")
    parser.add_argument("--fleets", nargs="+", default=list(FLEETS), choices=list(FLEETS))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--markdown", default="", help="write the table as Markdown to this file")
    parser.add_argument("--json", dest="json_out", default="", help="write every cell's figures as JSON to this file")


def main(args: argparse.Namespace) -> int | None:
    """Run every (fleet, mode) cell; write the table."""
    shape = Turns(args.conversations, args.turns, args.instructions_tokens, args.task_tokens, args.user_tokens,
                  args.reply_tokens, args.concurrency, args.seed)
    vocab = wl.Vocab.from_tokenizer_dir()
    cells: list[Cell] = []
    with tempfile.TemporaryDirectory(prefix="agent-turns-") as scratch:
        for fleet in args.fleets:
            for mode in MODES:
                cell = asyncio.run(run_cell(fleet, mode, shape, args, vocab, scratch))
                cells.append(cell)
                print("  ".join(row(cell)), flush=True)
    data = {"shape": dataclasses.asdict(shape), "policy": args.policy, "workers": args.workers,
            "cells": [{"fleet": c.fleet, "mode": c.mode, "requests": c.requests, "prompt_tokens": c.prompt_tokens,
                       "cached_tokens": c.cached_tokens, "hit": c.hit, "ideal": c.ideal, "misses": c.misses, "wall_s": c.wall_s}
                      for c in cells]}  # fmt: skip
    table = results.Table.of(f"{args.conversations} conversations x {args.turns} turns, {args.policy}", HEADER, [row(c) for c in cells])
    return results.write(results.Result(tables=[table], data=data), json_path=args.json_out, markdown_path=args.markdown)
