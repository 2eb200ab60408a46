"""Builds a model's fast encoder (``tokenization.fast_bpe``) without stalling the event loop.

Building it is seconds of CPU, and a thread is not enough to keep it away from the
loop: most of that time is spent in long C calls that hold the GIL (serializing and
parsing the model's JSON, tiktoken's tables, the self-check's batch of every token),
each a stall of a tenth of a second or more, and the Python parts between them take the
GIL back from the loop every few milliseconds. The plan (``plan_fast_bpe_at``: the
vocabulary walk and the self-check) is therefore made in a child process started for
it, from the tokenizer's files; this process only builds tiktoken's tables from the
plan. A tokenizer with no files (built in memory), or a child that cannot be started
or fails, falls back to building it in a thread here, as before.
"""

from __future__ import annotations

import logging
import multiprocessing
import threading
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor

from gateway.tokenization import Tokenizer
from gateway.tokenization.fast_bpe import FastBpePlan
from gateway.tokenization.tokenizer import plan_fast_bpe_at

log = logging.getLogger(__name__)

PlanMaker = Callable[[str], "FastBpePlan | None"]


def plan_in_child(path: str, make: PlanMaker = plan_fast_bpe_at) -> FastBpePlan | None:
    """``make(path)`` run in a fresh child process (spawned: nothing of this process's
    threads or sockets is inherited), which exits once it answered."""
    with ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn")) as pool:
        return pool.submit(make, path).result()


def build_encoder(tokenizer: Tokenizer, make: PlanMaker = plan_fast_bpe_at) -> None:
    """Give ``tokenizer`` its fast encoder (``fast_bpe_ready`` is True afterwards, whatever
    happens): planned in a child process when it has files, else here."""
    path = tokenizer.path
    if path is not None:
        try:
            fast = tokenizer.install_fast_bpe(plan_in_child(str(path), make))
        except Exception as exc:  # no child process here, or it failed: build it in this one
            log.warning("fast encoder for %s: the child process failed (%s); building it in this process",
                        tokenizer.name, exc)
        else:
            log.info("fast encoder for %s: %s", tokenizer.name, "ready" if fast is not None else "does not apply")
            return
    _ = tokenizer.fast_bpe


def start_build(tokenizer: Tokenizer, make: PlanMaker = plan_fast_bpe_at) -> threading.Thread:
    """``build_encoder`` in a daemon thread of its own (it waits for the child there)."""
    thread = threading.Thread(target=build_encoder, args=(tokenizer, make), name="fast-bpe-build", daemon=True)
    thread.start()
    return thread
