"""What a model joining a running gateway costs its event loop: the CPU time of each step
of loading its tokenizer that runs in the serving process as one native call holding the
GIL (no other thread of the process, the event loop included, runs meanwhile).

Each step runs here, in this process, ``--repeat`` times; its thread CPU time (the least
of the repeats) is what it stalls the loop for on an idle core, whatever the host's load
(a loaded host stretches the stall in wall time, not in CPU). The rows cover both ways the
gateway has loaded a tokenizer: the whole ``tokenizer.json`` parsed in the serving process,
and the file read in a child process and rebuilt from its parts
(``gateway.tokenization.backend_parts``); steps made of many short native calls report the
longest one. A model that joins a running gateway keeps a byte-level vocabulary in Python
tables instead (``gateway.tokenization.vocabulary_table``: the tokenizer helper process
encodes), so neither the vocabulary's BPE model nor tiktoken's table is built there; the
rows of that way report its longest step and the rest of it.

    token-gateway bench join-holds
    token-gateway bench join-holds --tokenizer-dir ./my-model --repeat 5
"""

from __future__ import annotations

import argparse
import pickle
import time
from array import array
from collections.abc import Callable
from pathlib import Path
from typing import Any

HEADER = ("step", "where it runs", "CPU (one native call)")


def cpu_ms(work: Callable[[], Any], repeat: int) -> float:
    """The least thread CPU time of ``repeat`` runs of ``work``, in ms."""
    best = float("inf")
    for _ in range(repeat):
        started = time.thread_time()
        work()
        best = min(best, time.thread_time() - started)
    return best * 1000


def measure(folder: Path, repeat: int) -> list[tuple[str, str, float]]:
    """(step, where it runs, CPU ms) for the tokenizer in ``folder``."""
    from tokenizers import Tokenizer as BackendTokenizer
    from tokenizers import models

    from gateway.tokenization.backend_parts import STEP, split_backend
    from gateway.tokenization.fast_bpe import plan_fast_bpe
    from gateway.tokenization.vocabulary_table import decodes_from_bytes

    json_file = folder / "tokenizer.json"
    text = json_file.read_text(encoding="utf-8")
    rows = [("the whole tokenizer.json parsed", "serving process before; child now",
             cpu_ms(lambda: BackendTokenizer.from_file(str(json_file)), repeat))]  # fmt: skip
    backend = BackendTokenizer.from_file(str(json_file))
    plan = plan_fast_bpe(backend)
    if plan is not None:
        as_dict = pickle.dumps(plan.ranks)
        rows.append(("the encoder plan's ranks unpickled as one dict", "serving process before",
                     cpu_ms(lambda: pickle.loads(as_dict), repeat)))  # fmt: skip
        keys, values = list(plan.ranks)[:STEP], list(plan.ranks.values())[:STEP]
        rows.append(("the ranks sent packed: one step of the dict", "serving process now",
                     cpu_ms(lambda: dict(zip(keys, values, strict=True)), repeat)))  # fmt: skip
    split = split_backend(text)
    if split is not None:
        parts = split[0]
        blob = pickle.dumps(parts)
        rows.append(("the parts unpickled", "serving process now", cpu_ms(lambda: pickle.loads(blob), repeat)))
        rows.append(("the vocabulary's pieces split out of one string", "serving process now",
                     cpu_ms(lambda: parts.pieces.split("\x00"), repeat)))  # fmt: skip
        pieces = parts.pieces.split("\x00")
        ids, halves = array("I"), array("I")
        ids.frombytes(parts.ids)
        halves.frombytes(parts.merges)
        rows.append(("one step of the vocabulary dict", "serving process now",
                     cpu_ms(lambda: dict(zip(pieces[:STEP], ids[:STEP], strict=True)), repeat)))  # fmt: skip
        step = halves[: 2 * STEP]
        rows.append(("one step of the merge list", "serving process now", cpu_ms(
            lambda: list(zip(map(pieces.__getitem__, step[0::2]), map(pieces.__getitem__, step[1::2]), strict=True)),
            repeat)))  # fmt: skip
        rows.append(("the shell (the file without vocabulary and merges) parsed", "serving process now",
                     cpu_ms(lambda: BackendTokenizer.from_str(parts.shell), repeat)))  # fmt: skip
        vocab = dict(zip(pieces, ids, strict=True))
        merges = list(zip(map(pieces.__getitem__, halves[0::2]), map(pieces.__getitem__, halves[1::2]), strict=True))
        merged = "serving process, on the first text tiktoken does not take" if plan is not None else "serving process"
        rows.append(("the BPE model from the vocabulary and merges", merged,
                     cpu_ms(lambda: models.BPE(vocab, merges, **parts.options), repeat)))  # fmt: skip
        if plan is not None:
            rows.append(("the BPE model from the vocabulary alone (merges deferred)", START_UP,
                         cpu_ms(lambda: models.BPE(vocab, [], **parts.options), repeat)))  # fmt: skip
        if decodes_from_bytes(parts):
            longest, rest = tables_holds(parts, repeat)
            rows.append(("the vocabulary in tables: the longest of its steps", JOINED, longest))
            rows.append(("the vocabulary in tables: all but its steps (the shell, the added tokens)", JOINED, rest))
    if plan is not None:
        import tiktoken._tiktoken as native

        rows.append(("tiktoken's table from the plan", START_UP, cpu_ms(lambda: plan.build(backend), repeat)))
        rows.append(("of which tiktoken's native CoreBPE constructor", START_UP,
                     cpu_ms(lambda: native.CoreBPE(plan.ranks, {}, plan.pattern), repeat)))  # fmt: skip
    return rows


START_UP = "serving process, a model known at start-up (and a joined one without tables)"
JOINED = "serving process, a model that joins at run time"


def tables_holds(parts: Any, repeat: int) -> tuple[float, float]:
    """(the longest step, the CPU outside the steps) of ``table_backend(parts)`` in ms, each
    the least of ``repeat`` runs."""
    from gateway.tokenization.vocabulary_table import table_backend

    longest = rest = float("inf")
    for _ in range(repeat):
        steps, step = _step_clock()
        started = time.thread_time()
        table_backend(parts, after_step=step)
        total = time.thread_time() - started
        longest = min(longest, max(steps, default=0.0))
        rest = min(rest, total - sum(steps))
    return longest * 1000, rest * 1000


def result(rows: list[tuple[str, str, float]], folder: Path) -> Any:
    from gateway_lab.bench.results import Result, Table

    cells = [(step, where, f"{ms:.1f} ms") for step, where, ms in rows]
    return Result(tables=[Table.of(f"native calls of a join ({folder.name})", HEADER, cells)],
                  notes=["least thread CPU time of the repeats: a loop stall of that length on an idle core"],
                  data={"rows": [{"step": s, "where": w, "cpu_ms": ms} for s, w, ms in rows]})  # fmt: skip


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The scenario's flags (``token-gateway bench join-holds --help``)."""
    parser.add_argument("--tokenizer-dir", default="", help="the tokenizer folder (empty: the bundled Qwen3 files)")
    parser.add_argument("--repeat", type=int, default=3, help="runs of each step (the least CPU time is kept)")
    parser.add_argument("--json", default="", help="also write the results here as JSON")
    parser.add_argument("--markdown", default="", help="also write the table here as Markdown")


def main(args: argparse.Namespace) -> int:
    """Run the scenario with parsed flags."""
    from gateway_lab.bench.results import write
    from gateway_lab.bench.workloads import default_tokenizer_dir

    folder = Path(args.tokenizer_dir) if args.tokenizer_dir else default_tokenizer_dir()
    return write(result(measure(folder, max(1, args.repeat)), folder), json_path=args.json, markdown_path=args.markdown)


def _step_clock() -> tuple[list[float], Callable[[], None]]:
    """(the thread CPU time of each step, what to call at each step's end)."""
    steps: list[float] = []
    mark = [time.thread_time()]

    def step() -> None:
        now = time.thread_time()
        steps.append(now - mark[0])
        mark[0] = now

    return steps, step
