"""Chat templates rendered with a deadline, never holding the event loop for long.

A chat template is code, and it usually comes from a worker (its GetTokenizer zip),
which the gateway trusts no more than a client. jinja2's sandbox stops a template
from reaching outside, but not from looping: two nested ``range(100000)`` loops spin
for hours. A watchdog thread therefore raises an exception inside any render that
runs past its deadline: a template is pure-Python bytecode, so the exception lands
at its next instruction.

An honest render takes tens of microseconds, less than handing it to a thread and
back costs, so it runs inline on the event loop under a short deadline
(``inline_timeout_s``). A render that passes it is stopped and run again on one of
the runner's own threads under the full deadline (``timeout_s``), and its template
(``key``) renders on those threads from then on, so a hostile template holds the
event loop once, for milliseconds. Large inputs (``size`` over ``offload_chars``)
go to the threads at once, one at a time: each render thread that holds Python work
is one more thread the event loop waits behind for the GIL, and two large renders at
once (four long conversations) kept ``/health`` waiting about twice as long as one.
A large render that runs past its deadline marks its template slow, and a slow
template's renders do not take that turn (a hostile template cannot hold the others'
large renders back for more than one deadline). A spinning render thread only takes
the GIL in turns: the event loop keeps answering meanwhile.

Deadlines count the rendering thread's CPU time, not the wall clock: on a busy host a
thread can wait for a core longer than an honest render takes, and that wait must not
count against the template. A render thread's wall time is bounded too, at
``WALL_FACTOR`` times its deadline, so a starved host still answers in bounded time.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import ctypes
import logging
import queue
import threading
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any, TypeVar

T = TypeVar("T")

log = logging.getLogger(__name__)

TICK_S = 0.01
"""The watchdog's shortest sleep: an overdue render is stopped at most about this late."""

IDLE_AFTER_S = 1.0
"""The watchdog sleeps until the next render once none came for this long."""

WALL_FACTOR = 3.0
"""A render on a template thread is stopped after this many times its deadline in wall time."""


class RenderTimeout(Exception):
    """The render ran past its deadline."""


class _Interrupt(BaseException):
    """Raised inside an overdue render: a BaseException, so the ``except Exception`` of
    the code around a template (which turns template errors into client errors) lets it
    through to the runner."""


@dataclass(slots=True)
class _Job:
    fn: Callable[[], Any]
    future: concurrent.futures.Future[Any] | None
    started: float = 0.0  # the rendering thread's CPU time when the render began
    wall: float = 0.0  # the monotonic clock then
    thread: int = 0
    clock: int = 0  # that thread's CPU-time clock


_clocks = threading.local()


def _thread_clock() -> int:
    """The calling thread's CPU-time clock id (read from another thread by the watchdog)."""
    clock: int | None = getattr(_clocks, "id", None)
    if clock is None:
        clock = _clocks.id = time.pthread_getcpuclockid(threading.get_ident())
    return clock


_STOP = object()


def _interrupt(thread_id: int) -> None:
    """Raise ``_Interrupt`` in thread ``thread_id`` at its next bytecode instruction."""
    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread_id), ctypes.py_object(_Interrupt))


def _checkpoint() -> None:
    """A Python call: an interrupt sent just before a render's end lands here at the
    latest (a function's first instruction checks for one), inside the runner's ``try``."""


class TemplateRunner:
    """``await runner.render(key, size, fn, *args, **kwargs)``: ``fn(*args, **kwargs)``,
    inline or on a render thread, at most ``timeout_s`` seconds of it (then ``RenderTimeout``)."""

    def __init__(
        self, threads: int = 2, timeout_s: float = 2.0, *, inline_timeout_s: float = 0.05, offload_chars: int = 65536
    ) -> None:
        self.timeout_s = timeout_s
        self.inline_timeout_s = inline_timeout_s
        self.offload_chars = offload_chars
        self.slow: set[Hashable] = set()  # templates that ran past the inline deadline once
        self._jobs: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._busy: dict[int, _Job] = {}  # render thread id -> its job
        self._inline: _Job | None = None
        self._lock = threading.Lock()  # taken directly on the event loop's path: cheaper than the Condition's
        self._cond = threading.Condition(self._lock)
        self.checks = 0  # the watchdog's wake-ups (it sleeps until the soonest deadline that may pass)
        self._closed = False
        self._idle = True  # the watchdog sleeps until a render starts
        self._last = 0.0  # when the last render started
        self._large: asyncio.Lock | None = None  # one large render at a time (made on the loop that uses it)
        self._threads = [
            threading.Thread(target=self._serve, name=f"chat-template-{i}", daemon=True) for i in range(max(1, threads))
        ]
        for thread in self._threads:
            thread.start()
        self._watchdog = threading.Thread(target=self._watch, name="chat-template-watchdog", daemon=True)
        self._watchdog.start()

    async def render(self, key: Hashable, size: int, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        if self._closed:
            raise RuntimeError("the template runner is closed")
        if size <= self.offload_chars and key not in self.slow:
            job = _Job(lambda: fn(*args, **kwargs), None)
            try:
                return self._run_inline(job)  # type: ignore[no-any-return]
            except _Interrupt:
                self.slow.add(key)
                log.warning(
                    "a chat template ran past %gs on the event loop; it renders on a thread from now on",
                    self.inline_timeout_s,
                )
        if size > self.offload_chars and key not in self.slow:
            return await self._run_large(key, fn, *args, **kwargs)
        return await self.run(fn, *args, **kwargs)

    async def _run_large(self, key: Hashable, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """``run`` for a large input of a template not known slow, after the large render
        before it has ended. The turn passes when the render ends, not when its caller
        leaves: a caller cancelled mid-render does not let the next one overlap it."""
        if self._large is None:
            self._large = asyncio.Lock()
        large = self._large
        await large.acquire()
        if self._closed:
            large.release()
            raise RuntimeError("the template runner is closed")
        future: concurrent.futures.Future[T] = concurrent.futures.Future()
        loop = asyncio.get_running_loop()
        future.add_done_callback(lambda _: loop.call_soon_threadsafe(large.release))
        self._jobs.put(_Job(lambda: fn(*args, **kwargs), future))
        try:
            return await asyncio.wrap_future(future)  # a cancelled caller cancels a job not yet started
        except RenderTimeout:
            self.slow.add(key)
            raise

    async def run(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """``fn(*args, **kwargs)`` on a render thread."""
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

    # ------------------------------------------------------------------ inline
    def _run_inline(self, job: _Job) -> Any:
        """``job.fn()`` on this thread; ``_Interrupt`` if it passed the inline deadline."""
        clock = _thread_clock()
        with self._lock:
            job.started = time.clock_gettime(clock)
            job.thread, job.clock = threading.get_ident(), clock
            self._last = time.monotonic()
            self._inline = job
            if self._idle:
                self._idle = False
                self._cond.notify()
        try:
            return job.fn()
        finally:
            with self._lock:
                self._inline = None
                _checkpoint()

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
        future = job.future
        assert future is not None
        if not future.set_running_or_notify_cancel():
            return  # its caller left while it waited
        me, clock = threading.get_ident(), _thread_clock()
        try:
            with self._cond:
                job.started = time.clock_gettime(clock)
                job.thread, job.clock = me, clock
                self._last = job.wall = time.monotonic()
                self._busy[me] = job
                if self._idle:
                    self._idle = False
                    self._cond.notify()
            try:
                result = job.fn()
            finally:
                with self._cond:
                    self._busy.pop(me, None)
                    _checkpoint()
        except _Interrupt:
            future.set_exception(RenderTimeout(f"the chat template ran longer than {self.timeout_s:g}s"))
        except BaseException as exc:  # the caller gets whatever the render raised
            future.set_exception(exc)
        else:
            future.set_result(result)

    # ------------------------------------------------------------------ watchdog
    def _watch(self) -> None:
        """Stop overdue renders. It sleeps until the soonest deadline that may pass: that of
        a running render (what is left of its CPU time is at least as much wall time), or
        for a render that starts meanwhile, a whole deadline; it does not tick."""
        soonest = min(self.inline_timeout_s, self.timeout_s)  # a render starting now: overdue no sooner
        with self._cond:
            while not self._closed:
                self.checks += 1
                now = time.monotonic()
                wait = soonest
                inline = self._inline
                if inline is not None:
                    left = self.inline_timeout_s - (time.clock_gettime(inline.clock) - inline.started)
                    if left <= 0:
                        # Interrupted; watched on until its own ``finally`` clears it, and interrupted
                        # again after another deadline: an interrupt that lands in a weakref callback
                        # or a ``__del__`` is reported there and lost, and the render goes on.
                        _interrupt(inline.thread)
                        inline.started = time.clock_gettime(inline.clock)
                        wait = min(wait, self.inline_timeout_s)
                    else:
                        wait = min(wait, left)
                for thread_id, job in list(self._busy.items()):
                    left = min(
                        self.timeout_s - (time.clock_gettime(job.clock) - job.started),
                        WALL_FACTOR * self.timeout_s - (now - job.wall),
                    )
                    if left <= 0:  # likewise: watched on until its thread takes it off ``_busy``
                        _interrupt(thread_id)
                        job.started, job.wall = time.clock_gettime(job.clock), now
                        wait = min(wait, self.timeout_s)
                    else:
                        wait = min(wait, left)
                if self._busy or self._inline is not None or now - self._last < IDLE_AFTER_S:
                    self._cond.wait(max(TICK_S, wait))
                else:
                    self._idle = True
                    self._cond.wait()
