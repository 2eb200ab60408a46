"""Continuous batching in simulated time, over the radix KV cache.

One asyncio task per worker runs scheduler steps. A step

1. continues the prompts being prefilled and admits waiting sequences (FIFO,
   up to ``max_running_requests``, only when the KV pool can hold the
   uncached prompt plus the output the sequence may still produce), within a
   chunked-prefill token budget;
2. costs ``base + prefill_cost * new_prefill_tokens + decode_cost * decoding``
   simulated seconds, slept at ``time_scale`` (never when the cost is 0);
3. then takes effect: every sequence that was decoding emits one token,
   every prompt that finished prefilling is inserted into the cache and emits
   its first token, finished sequences insert prompt+output and release
   their locks.

Output reaches each request's :class:`Sink` as tiny ``(seq, start, end,
final)`` records; the gRPC handler slices the tokens itself, so the step loop
never builds protobufs or copies token lists.

Free steps (every step cost 0: the benchmarks' zero-cost workers) take no time,
simulated or real, so nothing can happen between them: the loop runs them back to
back in one event-loop turn (for at most ``ZERO_COST_BURST_S``), and a sequence
that is decoding runs its remaining decode steps in one go. The sequences, tokens,
cache contents, KV events and counters are those of step-by-step running; what goes
is one loop turn (an epoll call and a task switch) per token, and the per-step
bookkeeping. Requests that arrive in the same loop turn still share their steps.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable
from enum import Enum

from gateway_lab.sim.config import SimConfig
from gateway_lab.sim.counters import SimCounters
from gateway_lab.sim.radix_cache import Node, RadixCache
from gateway_lab.sim.sampler import TokenSource
from gateway_lab.sim.timeline import Timeline

FAULT = "fault"  # internal finish reason of the fail-after-tokens knob
ZERO_COST_BURST_S = 0.002  # free steps run back to back for at most this long per loop turn


class State(Enum):
    WAITING = 0
    PREFILL = 1
    DECODE = 2
    DONE = 3


class Sink:
    """Where the sequences of one request deliver output records.

    One reader (the request's gRPC handler) waits on a bare future, made only when
    there is nothing to read yet: cheaper per request than an ``asyncio.Event``."""

    __slots__ = ("_waiter", "items")

    def __init__(self) -> None:
        self.items: list[tuple[Sequence, int, int, bool]] = []
        self._waiter: asyncio.Future[None] | None = None

    def push(self, item: tuple[Sequence, int, int, bool]) -> None:
        self.items.append(item)
        waiter = self._waiter
        if waiter is not None:
            self._waiter = None
            if not waiter.done():
                waiter.set_result(None)

    async def wait(self) -> None:
        """Until there is something to take."""
        while not self.items:
            waiter = self._waiter = asyncio.get_running_loop().create_future()
            try:
                await waiter
            finally:
                self._waiter = None

    def take(self) -> list[tuple[Sequence, int, int, bool]]:
        items, self.items = self.items, []
        return items


class Sequence:
    """One sample of a request as the scheduler tracks it."""

    __slots__ = (
        "cached",
        "fail_after",
        "finish_reason",
        "ignore_eos",
        "index",
        "interval",
        "logprobs",
        "matched",
        "max_new",
        "min_new",
        "node",
        "on_prefilled",
        "output",
        "prefilled",
        "private",
        "prompt",
        "prompt_len",
        "rank",
        "reported_cached",
        "reserve_left",
        "rid",
        "sent",
        "sink",
        "source",
        "state",
        "stop_ids",
        "stream",
        "transferred",
        "tree_len",
    )

    def __init__(
        self,
        rid: str,
        index: int,
        prompt: list[int],
        source: TokenSource,
        sink: Sink,
        *,
        max_new: int,
        min_new: int = 0,
        stop_ids: frozenset[int] = frozenset(),
        ignore_eos: bool = False,
        stream: bool = True,
        interval: int = 1,
        fail_after: int = -1,
        transferred: bool = False,
        reported_cached: int | None = None,
        on_prefilled: Callable[[Sequence], None] | None = None,
    ) -> None:
        self.rid = rid
        self.index = index
        self.prompt = prompt
        self.prompt_len = len(prompt)
        self.source = source
        self.sink = sink
        self.max_new = max_new
        self.min_new = min_new
        self.stop_ids = stop_ids
        self.ignore_eos = ignore_eos
        self.stream = stream
        self.interval = max(1, interval)
        self.fail_after = fail_after
        self.transferred = transferred  # PD decode: the prompt's KV arrives ready
        self.reported_cached = reported_cached
        self.on_prefilled = on_prefilled
        self.rank = 0  # the data-parallel rank (scheduler) that runs it
        self.output: list[int] = []
        self.logprobs: list[float] = []
        self.state = State.WAITING
        self.cached = 0
        self.prefilled = 0
        self.node: Node | None = None  # locked tree node (prefix held in the tree)
        self.tree_len = 0  # tokens of the prompt/output held through ``node``
        self.private = 0  # pool slots held outside the tree
        self.reserve_left = 0  # output slots promised at admission, not yet used
        self.sent = 0  # output tokens already handed to the sink
        self.finish_reason = ""
        self.matched: int | None = None

    @property
    def cached_tokens(self) -> int:
        """What the worker reports as cached for this sample."""
        return self.cached if self.reported_cached is None else self.reported_cached

    @property
    def done(self) -> bool:
        return self.state is State.DONE


class Scheduler:
    """Waiting queue, running set and the step loop of one worker."""

    def __init__(self, config: SimConfig, cache: RadixCache, counters: SimCounters) -> None:
        self.config = config
        self.cache = cache
        self.counters = counters
        self.waiting: deque[Sequence] = deque()
        self.prefilling: list[Sequence] = []
        self.decoding: list[Sequence] = []
        self.reserved = 0  # output slots promised to running sequences
        self.after_step: Callable[[], None] | None = None
        self.idle = asyncio.Event()
        self.idle.set()
        self._wake = asyncio.Event()
        self._stopped = False
        self._deadline = 0.0
        self._uncached_memo: tuple[tuple[int, int, int], int] = ((-1, -1, -1), 0)
        self._throughput: deque[tuple[float, int]] = deque(maxlen=64)
        self.last_receive = 0.0
        self.last_step = time.monotonic()  # when the last step took effect
        self.timeline: Timeline | None = None  # per-request times, when a bench attaches one

    # ---------------------------------------------------------------- queries
    @property
    def num_running(self) -> int:
        return len(self.prefilling) + len(self.decoding)

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    def waiting_uncached_tokens(self) -> int:
        """Prompt tokens of waiting sequences the cache does not hold (memoized per step)."""
        key = (self.counters.steps, self.counters.samples, len(self.waiting))
        if self._uncached_memo[0] == key:
            return self._uncached_memo[1]
        total = 0
        for seq in self.waiting:
            if seq.transferred:
                continue
            total += seq.prompt_len - self.cache.peek_prefix_len(seq.prompt, seq.prompt_len - 1)
        self._uncached_memo = (key, total)
        return total

    def queued_uncached_tokens(self) -> int:
        """Uncached prompt tokens still to prefill: the waiting sequences' and the rest of
        the ones mid-prefill (the work ahead of a request that arrives now)."""
        return self.waiting_uncached_tokens() + sum(s.prompt_len - s.prefilled for s in self.prefilling)

    def prefill_pending_tokens(self) -> int:
        """Prompt tokens of admitted or queued sequences that have no output yet."""
        return sum(s.prompt_len for s in self.waiting) + sum(s.prompt_len for s in self.prefilling)

    def gen_throughput(self) -> float:
        """Generated tokens per second over the last few seconds."""
        now = time.monotonic()
        self._sample_throughput(now)
        if len(self._throughput) < 2:
            return 0.0
        t0, g0 = self._throughput[0]
        for t, g in self._throughput:
            if now - t <= 5.0:
                t0, g0 = t, g
                break
        return (self.counters.generated_tokens - g0) / (now - t0) if now > t0 else 0.0

    def _sample_throughput(self, now: float) -> None:
        if not self._throughput or now - self._throughput[-1][0] >= 0.25:
            self._throughput.append((now, self.counters.generated_tokens))

    # ---------------------------------------------------------------- control
    def fits(self, prompt_len: int, max_new: int) -> bool:
        """Whether a sequence could ever be admitted into an empty pool."""
        return prompt_len + max_new <= self.cache.capacity

    @property
    def free_steps(self) -> bool:
        """Whether every step costs nothing (read live: tests retune a running worker)."""
        cfg = self.config
        return not (cfg.step_base_s or cfg.prefill_token_s or cfg.decode_seq_s)

    def submit(self, seq: Sequence) -> None:
        if self.timeline is not None and seq.index == 0:
            self._note_arrival(seq, self.timeline)
        self.counters.samples += 1
        self.last_receive = time.time()
        if self.idle.is_set():
            self.last_step = time.monotonic()  # an idle engine has not been silent
        self.waiting.append(seq)
        self.idle.clear()
        self._wake.set()

    def _note_arrival(self, seq: Sequence, timeline: Timeline) -> None:
        """What is ahead of ``seq`` as it arrives: the queue as it really is."""
        try:
            now = asyncio.get_running_loop().time()  # the clock the step loop's deadline is on
        except RuntimeError:
            now = self._deadline
        timeline.received(
            seq.rid, seq.prompt_len, self.num_waiting + self.num_running, self.queued_uncached_tokens(),
            self._deadline - now,  # the step sleeping now ends then (past: none is)
        )

    def abort(self, seq: Sequence, reason: str = "abort") -> bool:
        """End ``seq`` now, freeing its slots and locks; False if it had finished."""
        if seq.state is State.DONE:
            return False
        if seq.state is State.WAITING:
            self.waiting.remove(seq)
            seq.state = State.DONE
            seq.finish_reason = reason
            self.counters.aborted += 1
            seq.sink.push((seq, seq.sent, len(seq.output), True))
        else:
            if seq.state is State.PREFILL:
                self.prefilling.remove(seq)
            else:
                self.decoding.remove(seq)
            self._finish(seq, reason, insert=False)
        self._check_idle()
        return True

    def stop(self) -> None:
        """End the step loop; every unfinished sequence is aborted."""
        self._stopped = True
        self._wake.set()
        for seq in [*self.waiting, *self.prefilling, *self.decoding]:
            self.abort(seq)

    def _check_idle(self) -> None:
        if not self.waiting and not self.prefilling and not self.decoding:
            self.idle.set()

    # ---------------------------------------------------------------- loop
    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        cfg = self.config
        burst_until = 0.0  # free steps run back to back until this loop time
        while not self._stopped:
            if not self.waiting and not self.prefilling and not self.decoding:
                self._wake.clear()
                self.idle.set()
                await self._wake.wait()
                burst_until = 0.0
                continue
            decode_batch = list(self.decoding)
            prefill_plan = self._plan_prefill()
            if not decode_batch and not prefill_plan:
                if self.decoding:
                    continue  # only transferred (PD decode) sequences were admitted
                # Nothing can run (cannot happen while anything runs: the
                # prefill budget is >= 1); wait for an abort or a submission.
                self._wake.clear()
                await self._wake.wait()
                continue
            if self.free_steps:
                now = loop.time()
                if now >= burst_until:  # the burst's time is up: let the loop turn once
                    if burst_until:
                        await asyncio.sleep(0)
                        if self._stopped:
                            break
                        burst_until = 0.0
                        continue  # plan again: the turn may have brought aborts and arrivals
                    burst_until = now + ZERO_COST_BURST_S
                self.counters.steps += 1
                self._apply(decode_batch, prefill_plan)
                if self.after_step is not None:
                    self.after_step()
                if self._decode_free(loop.time() + ZERO_COST_BURST_S) and self.after_step is not None:
                    self.after_step()  # the decode run's events (finished sequences' inserts) in a batch of their own
                continue
            new_tokens = sum(take for _, take in prefill_plan)
            cost = cfg.step_cost(new_tokens, len(decode_batch))
            self.counters.steps += 1
            self.counters.busy_seconds += cost
            delay = cost * cfg.time_scale
            if delay > 0:
                now = loop.time()
                self._deadline = max(self._deadline, now) + delay
                await asyncio.sleep(self._deadline - now)
            else:
                await asyncio.sleep(0)
            if self._stopped:
                break
            self._apply(decode_batch, prefill_plan)
            if self.after_step is not None:
                self.after_step()

    def _plan_prefill(self) -> list[tuple[Sequence, int]]:
        """Spend this step's prefill budget: running prompts first, then admissions."""
        budget = self.config.chunked_prefill_size
        plan: list[tuple[Sequence, int]] = []
        for seq in self.prefilling:
            if budget <= 0:
                break
            take = min(seq.prompt_len - seq.prefilled, budget)
            budget -= take
            plan.append((seq, take))
        max_running = self.config.max_running_requests
        while self.waiting and budget > 0 and self.num_running < max_running:
            seq = self.waiting[0]
            if not self._admit(seq):
                break
            self.waiting.popleft()
            if seq.transferred:
                seq.state = State.DECODE
                self.decoding.append(seq)  # decodes from the next step on
                continue
            seq.state = State.PREFILL
            self.prefilling.append(seq)
            take = min(seq.prompt_len - seq.prefilled, budget)
            budget -= take
            plan.append((seq, take))
        return plan

    def _admit(self, seq: Sequence) -> bool:
        cache = self.cache
        node: Node | None = None
        cached = 0
        if not seq.transferred:
            # A worker always recomputes the last prompt token (it needs its logits).
            node, cached = cache.match_prefix(seq.prompt, seq.prompt_len - 1)
            cache.lock(node)
        uncached = seq.prompt_len - cached
        if cache.available_tokens < uncached + seq.max_new + self.reserved:
            if node is not None:
                cache.unlock(node)
            return False
        if not cache.alloc(uncached):  # pragma: no cover - guarded by the check above
            raise AssertionError("KV allocation failed after the capacity check")
        seq.node = node
        seq.cached = seq.prefilled = seq.tree_len = cached
        seq.private = uncached
        seq.reserve_left = seq.max_new
        self.reserved += seq.max_new
        self.counters.prompt_tokens += seq.prompt_len
        self.counters.cached_tokens += seq.cached_tokens
        if self.timeline is not None and seq.index == 0:
            self.timeline.admitted(seq.rid, seq.cached)
        return True

    def _apply(
        self, decode_batch: list[Sequence], prefill_plan: list[tuple[Sequence, int]]
    ) -> None:
        counters = self.counters
        active = [s for s in decode_batch if s.state is State.DECODE]
        if active:
            self._take_output_slots(len(active))
            for seq in active:
                self._emit(seq)
        prefilled_any = False
        for seq, take in prefill_plan:
            if seq.state is not State.PREFILL:
                continue  # aborted while the step ran
            seq.prefilled += take
            counters.prefill_tokens += take
            if seq.prefilled >= seq.prompt_len:
                prefilled_any = True
                self._prefill_done(seq)
        if prefilled_any:
            self.prefilling = [s for s in self.prefilling if s.state is State.PREFILL]
        if any(s.state is State.DONE for s in active) or prefilled_any:
            self.decoding = [s for s in self.decoding if s.state is State.DECODE]
        self.last_step = now = time.monotonic()
        self._sample_throughput(now)
        self._check_idle()

    def _decode_free(self, deadline: float) -> int:
        """Free steps: the decode steps of every decoding sequence, back to back (each
        sequence to its end, or until ``deadline``, loop time). The steps a batch would
        have taken are counted, and returned: as many as the longest run."""
        if not self.decoding:
            return 0
        loop_time = asyncio.get_running_loop().time
        longest = 0
        for seq in self.decoding:
            n = 0
            while seq.state is State.DECODE:
                self._take_output_slots(1)
                self._emit(seq)
                n += 1
                if not n & 255 and loop_time() >= deadline:
                    break
            longest = max(longest, n)
        self.counters.steps += longest
        self.decoding = [s for s in self.decoding if s.state is State.DECODE]
        self._check_idle()
        return longest

    def _take_output_slots(self, n: int) -> None:
        if not self.cache.alloc(n):  # pragma: no cover - reserved at admission
            raise AssertionError("KV pool exhausted despite reservations")
        self.reserved -= n

    def _prefill_done(self, seq: Sequence) -> None:
        cache = self.cache
        ps = cache.page_size
        whole = seq.prompt_len - seq.prompt_len % ps
        covered = whole - seq.tree_len
        if covered > 0:
            node, _ = cache.insert(seq.prompt, covered)
            cache.lock(node)
            if seq.node is not None:
                cache.unlock(seq.node)
            seq.node = node
            seq.tree_len = whole
            seq.private -= covered
        seq.state = State.DECODE
        self.decoding.append(seq)
        if self.timeline is not None and seq.index == 0:
            self.timeline.prefilled(seq.rid)
        if seq.on_prefilled is not None:
            seq.on_prefilled(seq)
        if seq.max_new == 0:
            self._finish(seq, "length")
            return
        self._take_output_slots(1)
        self._emit(seq)

    def _emit(self, seq: Sequence) -> None:
        """One decode step of ``seq``: one token (or its end)."""
        seq.private += 1
        seq.reserve_left -= 1
        out = seq.output
        n = len(out)
        if 0 <= seq.fail_after <= n:
            self._finish(seq, FAULT)
            return
        token, logprob, is_eos = seq.source.next(not seq.ignore_eos and n >= seq.min_new)
        out.append(token)
        seq.logprobs.append(logprob)
        n += 1
        self.counters.generated_tokens += 1
        if is_eos:
            self._finish(seq, "stop", token)
        elif seq.stop_ids and token in seq.stop_ids and n >= seq.min_new:
            self._finish(seq, "stop", token)
        elif n >= seq.max_new:
            self._finish(seq, "length")
        elif seq.stream and n - seq.sent >= seq.interval:
            seq.sink.push((seq, seq.sent, n, False))
            seq.sent = n

    def _finish(
        self, seq: Sequence, reason: str, matched: int | None = None, *, insert: bool = True
    ) -> None:
        cache = self.cache
        seq.state = State.DONE
        seq.finish_reason = reason
        seq.matched = matched
        self.reserved -= seq.reserve_left
        seq.reserve_left = 0
        if insert and seq.node is not None:
            # Like SGLang, keep prompt + output for reuse (e.g. the next chat turn).
            total = seq.prompt + seq.output
            whole = len(total) - len(total) % cache.page_size
            covered = whole - seq.tree_len
            if covered > 0:
                node, _ = cache.insert(total, covered)
                cache.lock(node)
                cache.unlock(seq.node)
                seq.node = node
                seq.private -= covered
        if seq.node is not None:
            cache.unlock(seq.node)
            seq.node = None
        cache.release(seq.private)
        seq.private = 0
        if reason == FAULT:
            self.counters.failed += 1
        elif reason == "abort":
            self.counters.aborted += 1
        else:
            self.counters.finished += 1
        seq.sink.push((seq, seq.sent if seq.stream else 0, len(seq.output), True))
        seq.sent = len(seq.output)
