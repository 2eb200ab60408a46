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

The tokenizer itself is loaded the same way when the catalog loads a model
(``parse_in_child``): ``tokenizers`` parses a ``tokenizer.json`` in one native call that
holds the GIL throughout, so the child reads the file and sends it back in parts this
process rebuilds it from in short steps (``tokenization.backend_parts``), with the
encoder's plan and the bound worked out in the same child; ``build_encoder`` then takes
those instead of starting another child.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import logging
import multiprocessing
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import TypeVar

from tokenizers import Tokenizer as BackendTokenizer

from gateway.tokenization import Tokenizer
from gateway.tokenization.backend_parts import BackendParts, merges_later
from gateway.tokenization.errors import TokenizerTooLarge
from gateway.tokenization.fast_bpe import FastBpePlan
from gateway.tokenization.length_bound import LengthBound
from gateway.tokenization.tokenizer import encoder_facts_at, load_facts_at
from gateway.tokenization.vocabulary_table import table_backend

log = logging.getLogger(__name__)

CHILDREN_AT_ONCE = 2
"""Children working out encoders at the same time (each holds a parsed tokenizer and its
tables, a few hundred MB for a 150k vocabulary, while it runs): models loading together,
at start-up, wait their turn."""
_CHILDREN = threading.BoundedSemaphore(CHILDREN_AT_ONCE)

Facts = tuple["FastBpePlan | None", "LengthBound | None"]
PlanMaker = Callable[[str], Facts]
LoadFacts = tuple["BackendParts | None", "FastBpePlan | None", "LengthBound | None"]
T = TypeVar("T")


def plan_in_child(path: str, make: Callable[[str], T] = encoder_facts_at) -> T:  # type: ignore[assignment]
    """``make(path)`` run in a fresh child process (spawned: nothing of this process's
    threads or sockets is inherited), which exits once it answered."""
    with ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn")) as pool:
        return pool.submit(make, path).result()


PREPARED_MAX = 8
"""Plans and bounds worked out with a parse and not taken by ``build_encoder`` yet (a
model whose encoder is built later, on its first prompts, takes them then)."""
_PREPARED: dict[int, tuple[BackendTokenizer, Facts]] = {}  # backend id -> (backend, its facts)
_PREPARED_LOCK = threading.Lock()


DEFAULT_MAX_VOCABULARY_ENTRIES = 400_000
"""Largest vocabulary a tokenizer may have to be loaded (``--max-vocabulary-entries``): the
serving process builds its model in one native call that holds the GIL, about a second
per 400,000 entries on a busy host (Qwen3 has 151,643, Gemma 3 262,144). A worker could
otherwise send one as large as its ``tokenizer.json`` bound allows."""


def capped_load_facts(max_entries: int) -> Callable[[str], LoadFacts]:
    """``load_facts_at`` refusing vocabularies past ``max_entries`` (picklable, for the child)."""
    return functools.partial(load_facts_at, max_entries=max_entries)


KEPT_PARSES = 4
"""Tokenizers kept parsed after their model may be gone, by the content of the files that
shape the parsed backend: a model that joins again (a worker restarted, a second name for
one tokenizer) takes the same backend, and with it its fast encoder and length bound
(``Tokenizer``'s built encoders are kept per backend), without one native build."""
_KEPT: dict[str, BackendTokenizer] = {}  # files' digest -> the backend parsed from them
_SHAPING_FILES = ("tokenizer_config.json", "special_tokens_map.json")
"""Beside ``tokenizer.json``, the files ``Tokenizer`` reads to adjust its backend (the
BOS/EOS post-processor)."""


def files_digest(json_file: Path) -> str:
    """SHA-256 of ``json_file`` and the files beside it that shape the backend made from it
    (each length-prefixed; a missing file counts as absent, not as empty)."""
    digest = hashlib.sha256()
    for file in (json_file, *(json_file.parent / name for name in _SHAPING_FILES)):
        try:
            data = file.read_bytes()
        except FileNotFoundError:
            digest.update(b"-")
            continue
        digest.update(b"+%d:" % len(data))
        digest.update(data)
    return digest.hexdigest()


def parse_in_child(
    json_file: Path, make: Callable[[str], LoadFacts] = load_facts_at, *, tables: bool = False
) -> BackendTokenizer:
    """The HF tokenizer of ``json_file`` (``Tokenizer.from_path``'s ``parse``): the one kept
    for the same files, else rebuilt here from the parts a child process cut the file into,
    the fast encoder's plan and the length bound kept for ``build_encoder``. With ``tables``
    (another process will hold the tokenizer and encode: a model that joins at run time) a
    byte-level vocabulary is kept in Python tables and no model of it is built here
    (``vocabulary_table``). When the file cannot be cut so (not a BPE model) or the child
    fails, the file is parsed here, holding the GIL as long as that takes."""
    key = files_digest(json_file)
    with _PREPARED_LOCK:
        kept = _KEPT.get(key)
    if kept is not None:
        log.info("tokenizer %s: the same files were parsed before; their backend is shared", json_file)
        return kept
    backend = _parse_in_child(json_file, make, tables)
    with _PREPARED_LOCK:
        if KEPT_PARSES > 0:
            _KEPT.pop(key, None)
            while len(_KEPT) >= KEPT_PARSES:
                _KEPT.pop(next(iter(_KEPT)))
            _KEPT[key] = backend
    return backend


def _parse_in_child(json_file: Path, make: Callable[[str], LoadFacts], tables: bool) -> BackendTokenizer:
    in_tables = None
    try:
        with _CHILDREN:
            parts, plan, bound = plan_in_child(str(json_file), make)
        if parts is None:
            backend = BackendTokenizer.from_file(str(json_file))
        elif tables and (in_tables := table_backend(parts)) is not None:
            backend = in_tables  # no model of the vocabulary here: the helper process encodes
        elif plan is not None:
            backend = merges_later(parts)  # tiktoken encodes; the merges wait until a text needs them
        else:
            backend = parts.build()
    except TokenizerTooLarge:
        raise  # refused: never built here either
    except Exception as exc:  # no child process here, or it failed: parse it in this one
        log.warning("tokenizer %s: the child process failed (%s); parsing it in this process", json_file, exc)
        return BackendTokenizer.from_file(str(json_file))
    with _PREPARED_LOCK:
        while len(_PREPARED) >= PREPARED_MAX:
            _PREPARED.pop(next(iter(_PREPARED)))
        _PREPARED[id(backend)] = (backend, (plan, bound))
    how = "parsed whole" if parts is None else "rebuilt from its parts" + (
        ", its vocabulary in tables" if in_tables is not None else ", merges deferred" if plan is not None else ""
    )
    log.info("tokenizer %s: %s", json_file, how)
    return backend


def _take_prepared(backend: BackendTokenizer) -> Facts | None:
    """The facts ``parse_in_child`` kept for ``backend``, once."""
    with _PREPARED_LOCK:
        found = _PREPARED.pop(id(backend), None)
    return found[1] if found is not None and found[0] is backend else None


def build_encoder(tokenizer: Tokenizer, make: PlanMaker = encoder_facts_at) -> None:
    """Give ``tokenizer`` its fast encoder and length bound (``fast_bpe_ready`` is True
    afterwards, whatever happens): from what ``parse_in_child`` kept for its backend, else
    worked out in a child process when it has files and they are not built for its backend
    yet, else here."""
    with _lock_for(tokenizer):  # models that share one parsed backend: one build
        path = tokenizer.path
        prepared = _take_prepared(tokenizer.backend)
        if prepared is not None and not tokenizer.encoders_built():
            fast = tokenizer.install_encoders(*prepared)
            log.info("fast encoder for %s: %s", tokenizer.name, "ready" if fast is not None else "does not apply")
            return
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
