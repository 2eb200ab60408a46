"""Builds a model's fast encoder (``tokenization.fast_bpe``) and length bound without
stalling the event loop.

Building them is seconds of CPU, and a thread is not enough to keep it away from the
loop: most of that time is spent in long C calls that hold the GIL (serializing and
parsing the model's JSON, tiktoken's tables, the self-check's batch of every token),
each a stall of a tenth of a second or more, and the Python parts between them take the
GIL back from the loop every few milliseconds. The encoder's plan and the bound
(``encoder_facts_at``: the vocabulary walks and the self-check) are therefore worked out
in a child process started for it, from the tokenizer's files; this process only builds
tiktoken's table from the plan. A tokenizer with no files (built in memory), or a child that cannot be started
or fails, falls back to building it in a thread here, as before. At most
``CHILDREN_AT_ONCE`` children run at a time.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor

from gateway.tokenization import Tokenizer
from gateway.tokenization.fast_bpe import FastBpePlan
from gateway.tokenization.length_bound import LengthBound
from gateway.tokenization.tokenizer import encoder_facts_at

log = logging.getLogger(__name__)

CHILDREN_AT_ONCE = 2
"""Children working out encoders at the same time (each holds a parsed tokenizer and its
tables, a few hundred MB for a 150k vocabulary, while it runs): models loading together,
at start-up, wait their turn."""
_CHILDREN = threading.BoundedSemaphore(CHILDREN_AT_ONCE)

Facts = tuple["FastBpePlan | None", "LengthBound | None"]
PlanMaker = Callable[[str], Facts]


def plan_in_child(path: str, make: PlanMaker = encoder_facts_at) -> Facts:
    """``make(path)`` run in a fresh child process (spawned: nothing of this process's
    threads or sockets is inherited), which exits once it answered."""
    with ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn")) as pool:
        return pool.submit(make, path).result()


def build_encoder(tokenizer: Tokenizer, make: PlanMaker = encoder_facts_at) -> None:
    """Give ``tokenizer`` its fast encoder and length bound (``fast_bpe_ready`` is True
    afterwards, whatever happens): worked out in a child process when it has files and
    they are not built for its backend yet, else here."""
    with _lock_for(tokenizer):  # models that share one parsed backend: one build
        path = tokenizer.path
        if path is not None and not tokenizer.encoders_built():
            try:
                with _CHILDREN:
                    facts = plan_in_child(str(path), make)
                fast = tokenizer.install_encoders(*facts)
            except Exception as exc:  # no child process here, or it failed: build it in this one
                log.warning("fast encoder for %s: the child process failed (%s); building it in this process",
                            tokenizer.name, exc)
            else:
                log.info("fast encoder for %s: %s", tokenizer.name, "ready" if fast is not None else "does not apply")
                return
        tokenizer.warm_encoders()


_LOCKS: dict[int, tuple[threading.Lock, list[int]]] = {}  # backend id -> (lock, [builds waiting])
_LOCKS_LOCK = threading.Lock()


@contextlib.contextmanager
def _lock_for(tokenizer: Tokenizer) -> Iterator[None]:
    """Hold the build lock of the tokenizer's parsed backend (its id cannot be reused while
    a build holds the tokenizer; the entry goes with the last build waiting on it)."""
    key = id(tokenizer.backend)
    with _LOCKS_LOCK:
        lock, waiting = _LOCKS.setdefault(key, (threading.Lock(), [0]))
        waiting[0] += 1
    try:
        with lock:
            yield
    finally:
        with _LOCKS_LOCK:
            waiting[0] -= 1
            if not waiting[0]:
                del _LOCKS[key]


def start_build(tokenizer: Tokenizer, make: PlanMaker = encoder_facts_at) -> threading.Thread:
    """``build_encoder`` in a daemon thread of its own (it waits for the child there)."""
    thread = threading.Thread(target=build_encoder, args=(tokenizer, make), name="fast-bpe-build", daemon=True)
    thread.start()
    return thread
