"""Chat templates rendered off the event loop, each render stopped at a deadline.

A chat template is code, and it usually comes from a worker (its GetTokenizer zip),
which the gateway trusts no more than a client. jinja2's sandbox stops a template
from reaching outside, but not from looping: two nested ``range(100000)`` loops
spin for hours. So renders run on a few threads of their own (the event loop keeps
answering meanwhile: a spinning thread only takes the GIL in turns), and a watchdog
thread raises an exception inside any render that runs past the deadline. A
template is pure-Python bytecode, so the exception lands at its next instruction;
the thread is this runner's, so it goes back to work afterwards.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import ctypes
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

T = TypeVar("T")

TICK_S = 0.02
"""How often the watchdog looks at running renders (only while there are some)."""


class RenderTimeout(Exception):
    """The render ran past its deadline."""


class _Interrupt(BaseException):
    """Raised inside an overdue render: a BaseException, so the ``except Exception`` of
    the code around a template (which turns template errors into client errors) lets it
    through to the runner."""


@dataclass(slots=True)
class _Job:
    fn: Callable[[], Any]
    future: concurrent.futures.Future[Any]
    started: float = 0.0


_STOP = object()


def _interrupt(thread_id: int) -> None:
    """Raise ``_Interrupt`` in thread ``thread_id`` at its next bytecode instruction."""
    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread_id), ctypes.py_object(_Interrupt))


class TemplateRunner:
    """``await runner.run(fn, *args)``: ``fn(*args)`` on a render thread, at most
    ``timeout_s`` seconds of it (``RenderTimeout`` after that)."""

    def __init__(self, threads: int = 2, timeout_s: float = 2.0) -> None:
        self.timeout_s = timeout_s
        self._jobs: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._busy: dict[int, _Job] = {}  # thread id -> the job it runs
        self._cond = threading.Condition()
        self._closed = False
        self._idle = True  # the watchdog waits for a render to start
        self._threads = [
            threading.Thread(target=self._serve, name=f"chat-template-{i}", daemon=True) for i in range(max(1, threads))
        ]
        for thread in self._threads:
            thread.start()
        self._watchdog = threading.Thread(target=self._watch, name="chat-template-watchdog", daemon=True)
        self._watchdog.start()

    async def run(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        if self._closed:
            raise RuntimeError("the template runner is closed")
        future: concurrent.futures.Future[T] = concurrent.futures.Future()
        self._jobs.put(_Job(lambda: fn(*args, **kwargs), future))
        return await asyncio.wrap_future(future)  # a cancelled caller cancels a job not yet started

    def close(self) -> None:
        self._closed = True
        for _ in self._threads:
            self._jobs.put(_STOP)
        with self._cond:
            self._cond.notify_all()
        self._watchdog.join(1.0)

    # ------------------------------------------------------------ render threads
    def _serve(self) -> None:
        job: Any = None
        while True:
            try:
                if job is None:
                    job = self._jobs.get()
                if job is _STOP:
                    return
                self._run(job)
                job = None
            except _Interrupt:
                # An interrupt that landed after its render ended: the job was settled
                # already, unless it struck before the job began (then run it again).
                if job is not None and job.started:
                    job = None

    def _run(self, job: _Job) -> None:
        if not job.future.set_running_or_notify_cancel():
            return  # its caller left while it waited
        me = threading.get_ident()
        try:
            with self._cond:
                job.started = time.monotonic()
                self._busy[me] = job
                if self._idle:  # else the watchdog is ticking already
                    self._cond.notify()
            try:
                result = job.fn()
            finally:
                with self._cond:
                    self._busy.pop(me, None)
        except _Interrupt:
            job.future.set_exception(RenderTimeout(f"the chat template ran longer than {self.timeout_s:g}s"))
        except BaseException as exc:  # the caller gets whatever the render raised
            job.future.set_exception(exc)
        else:
            job.future.set_result(result)

    # ------------------------------------------------------------------ watchdog
    def _watch(self) -> None:
        with self._cond:
            while not self._closed:
                now = time.monotonic()
                for thread_id, job in list(self._busy.items()):
                    if now - job.started >= self.timeout_s:
                        del self._busy[thread_id]  # interrupted once; its own finally finds it gone
                        _interrupt(thread_id)
                self._idle = not self._busy
                self._cond.wait(None if self._idle else TICK_S)
