"""CPU cost of reply token reuse per chat request, with the real Qwen3 tokenizer.

A 6-turn conversation (system 256 tokens, user 64, replies 64 generated ids that do not
round-trip) is tokenized turn by turn the way ``Engine.render_chat`` does, with the reply
cache and without it, and each finish is recorded; reports CPU microseconds per request
(best of ``--repeat``). Pure in-process work: run it under the bench lock anyway (it times
CPU). ``token-gateway bench reply-cache [--conversations 200] [--repeat 3]``
"""

from __future__ import annotations

import argparse
import random
import time
from typing import Any

from gateway.tokenization import PrefixTokenCache, Tokenizer
from gateway.tokenization.reply_cache import ReplyTokenCache, message_texts
from gateway_lab.bench import results
from gateway_lab.bench import workloads as wl


def conversation(tok: Tokenizer, vocab: wl.Vocab, rng: random.Random) -> list[tuple[list[dict[str, Any]], str, list[int]]]:
    """(messages of turn t, reply text, reply ids) for 6 turns."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": tok.decode(vocab.sample(rng, 256))}]
    turns = []
    for _ in range(6):
        messages = [*messages, {"role": "user", "content": tok.decode(vocab.sample(rng, 64))}]
        ids = list(vocab.sample(rng, 64))
        reply = tok.decode(ids, skip_special_tokens=False)
        turns.append((messages, reply, ids))
        messages = [*messages, {"role": "assistant", "content": reply}]
    return turns


def run(tok: Tokenizer, convs: list[Any], reuse: bool) -> tuple[float, int]:
    prompt = PrefixTokenCache(tok)
    replies = ReplyTokenCache(tok)
    rendered = [[tok.apply_chat_template(m) for m, _, _ in conv] for conv in convs]  # template cost is not ours
    n = 0
    start = time.process_time()
    for conv, texts in zip(convs, rendered, strict=True):
        for (messages, reply, ids), text in zip(conv, texts, strict=True):
            if reuse:
                spans = replies.spans(None, text, message_texts(messages))
                replies.encode_spliced(text, spans, prompt.encode) if spans else prompt.encode(text)
                replies.record(None, reply, ids)
            else:
                prompt.encode(text)
            n += 1
    return time.process_time() - start, n


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The scenario's flags (``token-gateway bench NAME --help``)."""
    parser.add_argument("--conversations", type=int, default=200)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--json", default="", help="also write the results here as JSON")
    parser.add_argument("--markdown", default="", help="also write the table here as Markdown")


def main(args: argparse.Namespace) -> int | None:
    """Run the scenario with parsed flags; the exit status."""
    tok = Tokenizer.from_path(wl.default_tokenizer_dir(), name="Qwen/Qwen3-0.6B")
    vocab = wl.Vocab.from_tokenizer_dir(str(wl.default_tokenizer_dir()))
    rng = random.Random(0)
    convs = [conversation(tok, vocab, rng) for _ in range(args.conversations)]
    rows, data = [], {}
    for reuse in (False, True):
        best = min(run(tok, convs, reuse)[0] for _ in range(args.repeat))
        n = 6 * len(convs)
        rows.append(("on" if reuse else "off", f"{best / n * 1e6:.1f}", n))
        data["on" if reuse else "off"] = {"us_cpu_per_request": best / n * 1e6, "requests": n}
    header = ("reply token reuse", "µs CPU per request (tokenize + record)", "requests")
    table = results.Table.of(f"chat tokenization, best of {args.repeat}", header, rows, labels=1)
    return results.write(results.Result(tables=[table], data=data), json_path=args.json, markdown_path=args.markdown)
