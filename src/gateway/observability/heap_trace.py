"""Opt-in Python heap snapshots of a running gateway, for hunting memory growth.

Set ``TOKEN_GATEWAY_TRACEMALLOC_DIR`` before ``token-gateway serve`` starts and each
SIGUSR2 writes ``heap-N.snapshot`` (``tracemalloc.Snapshot.dump``) into that
directory, N counting from 1. The first signal also starts ``tracemalloc``: tracing
the start-up itself (imports, tokenizer load) would slow it several-fold, and a
growth hunt only needs what is allocated after warm-up and still alive later.
Another process (the soak) compares two snapshots with
``Snapshot.load(b).compare_to(Snapshot.load(a), "traceback")``.
Off by default: tracing slows every allocation down.
"""

from __future__ import annotations

import gc
import logging
import os
import signal
import tracemalloc
from pathlib import Path
from types import FrameType

ENV_VAR = "TOKEN_GATEWAY_TRACEMALLOC_DIR"
FRAMES = 12  # deep enough to see which gateway call site sits under a library allocation

log = logging.getLogger("gateway")
_taken = 0


def snapshot_path(directory: str | Path, n: int) -> Path:
    return Path(directory) / f"heap-{n}.snapshot"


def _dump(directory: Path) -> Path:
    global _taken
    _taken += 1
    path = snapshot_path(directory, _taken)
    tmp = path.with_suffix(".partial")
    tracemalloc.take_snapshot().dump(str(tmp))
    tmp.rename(path)  # readers never see a half-written snapshot
    return path


def install_from_env() -> Path | None:
    """Start tracing and arm SIGUSR2 if the env var names a directory; return it (or None)."""
    raw = os.environ.get(ENV_VAR, "").strip()
    if not raw:
        return None
    directory = Path(raw)
    directory.mkdir(parents=True, exist_ok=True)

    def on_signal(signum: int, frame: FrameType | None) -> None:
        if not tracemalloc.is_tracing():
            tracemalloc.start(FRAMES)
            log.warning("tracemalloc started (%d frames)", FRAMES)
        gc.collect()  # a snapshot of live objects, not of cycles (exception tracebacks) awaiting collection
        path = _dump(directory)
        log.warning("heap snapshot written to %s (traced %.1f MB)", path, tracemalloc.get_traced_memory()[0] / 2**20)

    signal.signal(signal.SIGUSR2, on_signal)
    log.warning("SIGUSR2 starts tracemalloc and writes heap snapshots to %s", directory)
    return directory
