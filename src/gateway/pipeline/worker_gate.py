"""Per worker, the requests past its running slots wait in the gateway, in fair order.

Why: with the gateway's fleet queue on (``--fleet-headroom``), the fleet as a whole has a
slot for every request admitted, but the routing policy sends each one where its prefix is
cached, and that worker's slots may all be taken. Sent on, the request would wait in the
worker's own first-come queue, where a light API key's request sits behind a heavy key's.
Sent elsewhere instead (a hard slot bound), it pays a cold prefill, which on a worker whose
prefill is dear stalls every running request's decode step: the fleet then loses
throughput and hit rate to fairness. Here it is held in the gateway until a slot of the
chosen worker frees, and the held requests of one worker are let through by
``policies.fair_queue`` (weighted shares between keys, priority within a key), so a light
key's request takes the worker's next free slot. The policy still sees a held request as
the worker's load (its lease is taken before the wait), so a long wait makes it spill.

Prefill pacing (``prefill_budget``): a free running slot is not enough. A worker prefills
the requests it admitted first come, first served, and a step that prefills several cold
prompts is long; a light key's request admitted behind a heavy key's cold prefills gets
its first token only after all of them. So each worker also has a budget of uncached
prefill tokens: a request let through adds the tokens the policy predicts it must
prefill there, its first message (or any other end of its opening) takes them off, and
while the budget is spent the next request waits here, where the fair order picks it,
rather than in the worker's queue. A request alone always passes, however large; the
budget only ever holds requests while others' prefills are pending on that worker, and
only while the fleet is contended (``contended``: admission has requests waiting, every
slot taken, or more than one API key holding slots). Otherwise nobody needs to go first,
and a worker prefilling several requests in one step beats the gateway feeding them one
first token at a time.

Prefill reservation (``prefill_reserve``, with the budget): the budget lets one cold
prompt through per worker at a time, and at a heavy key's cold start every worker is
prefilling one of its cold prompts; a light key's cold prompt then waits for a whole
prefill step wherever it goes, and the gate's fair order cannot help, as the step has
begun. So a cold prompt (``cold_tokens`` and more uncached) of a key that yields
(``yields_prefill``: a lighter key is active) passes only if another worker would still
have no cold prefill pending; the router sends the lightest key's cold prompt to such a
worker (``reserves_for``, ``cold_pending``). The held one waits in its worker's queue, and
any worker's cold prefill ending looks at every worker's queue again.
And every key's cold prompt waits here while its worker already has a cold prefill pending,
contended or not: a key alone at its cold start would otherwise queue several cold prompts
in each worker's first-come queue, and a newcomer's first prompt, arriving a moment later,
would wait behind all of them wherever it goes; held here, it goes before them in fair
order. A lone key does not yield (a worker kept free for a newcomer that may never come
costs its own cold burst a prefill step), and one cold prompt per worker at a time costs it
little: a cold prompt sent to a worker in its prefill step waits for the next step anyway.

``CALLER`` carries the request's API key and priority from admission (set in the
request's own task) to here without threading them through every layer between.
"""

from __future__ import annotations

import asyncio
import contextvars
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from gateway.policies.fair_queue import Entry, FairQueue

CALLER: contextvars.ContextVar[tuple[str, int]] = contextvars.ContextVar("token_gateway_caller", default=("-", 0))
"""(API key id or "-", priority) of the request running in this task (set at admission)."""


@dataclass(slots=True)
class _Slots:
    """One worker's requests let through (sent, not yet ended) and the ones held."""

    queue: FairQueue
    through: int = 0
    cap: int = 0  # running slots + headroom: at most this many let through
    open: int = 0  # running slots - reserve: past this many, only keys below their share
    prefill: int = 0  # predicted uncached prefill tokens let through that have no first message yet
    cold: int = 0  # of those, requests of ``cold_tokens`` and more (prefill reservation)

    def fits(self, tokens: int, budget: int, cold: bool = False) -> bool:
        """Whether ``tokens`` more prefill tokens fit the pacing ``budget`` (0: no pacing;
        nothing pending: anything fits), and a ``cold`` prompt finds no other cold prefill
        pending here (the prefill reservation's pacing, contended or not)."""
        if cold and self.cold:
            return False
        return budget <= 0 or self.prefill == 0 or self.prefill + tokens <= budget


class Pass:
    """A request let through: calling it gives its slot back (and its prefill tokens, if
    still pending); ``prefilled`` gives back only the tokens (its first message came).
    Both are idempotent. ``waited``: it was held before it passed."""

    __slots__ = ("_gate", "_slots", "cold", "released", "tokens", "waited")

    def __init__(
        self, gate: WorkerGate | None, slots: _Slots | None, tokens: int, waited: bool = False, cold: bool = False,
    ) -> None:
        self._gate = gate
        self._slots = slots
        self.tokens = tokens  # pending prefill tokens (0 once given back)
        self.cold = cold  # counted in its worker's cold prefills (False once given back)
        self.waited = waited
        self.released = False

    def _give_back_prefill(self, slots: _Slots) -> bool:
        """Its pending prefill tokens back to ``slots``; True if it was a cold prefill."""
        slots.prefill -= self.tokens
        self.tokens = 0
        cold, self.cold = self.cold, False
        if cold:
            slots.cold -= 1
        return cold

    def prefilled(self) -> None:
        slots = self._slots
        if slots is None or not self.tokens:
            return
        cold = self._give_back_prefill(slots)
        assert self._gate is not None
        self._gate._granted_back(slots, cold)

    def __call__(self) -> None:
        if self.released or self._slots is None:
            return
        self.released = True
        slots = self._slots
        cold = self._give_back_prefill(slots)
        slots.through -= 1
        assert self._gate is not None
        self._gate._granted_back(slots, cold)


NO_GATE = Pass(None, None, 0)
"""What a request passes with where the gate does not apply (the worker reports no slots)."""


@dataclass(slots=True)
class _Waiter:
    future: asyncio.Future[None]
    tokens: int


class WorkerGate:
    """Holds requests for a worker whose ``max_running_requests + headroom`` sent requests
    have not ended; ``enter`` waits for a slot and returns its release (idempotent)."""

    def __init__(
        self,
        weights: dict[str, float] | None = None,
        *,
        headroom: int = 0,
        reserve: int = 0,
        below_share: Callable[[str], bool] = lambda tenant: False,
        aging_s: float = 0.0,
        low_values_first: bool = False,
        across_tenants: bool = False,
        prefill_budget: int = 0,
        share_first: bool = False,
        fair_spill: bool = False,
        prefill_reserve: bool = False,
        warm_reroute: bool = False,
        yields_prefill: Callable[[str], bool] = lambda tenant: False,
        contended: Callable[[], bool] = lambda: True,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``prefill_budget``: uncached prefill tokens each worker may have pending (let
        through, no first message yet) before the next request waits (0: no pacing), while
        ``contended`` says the fleet is.
        ``reserve``: of each worker's *running* slots, this many go only to a key that
        ``below_share`` says holds less than its weighted share (admission's count), and
        the headroom past them too: the light key's request then finds a running slot at
        once instead of waiting in the worker's queue for one to end, which with equal
        answer lengths can take a whole wave of the worker's batch."""
        self.headroom = max(0, headroom)
        self.reserve = max(0, reserve)
        self.prefill_budget = max(0, prefill_budget)
        self.share_first = share_first
        self.fair_spill = fair_spill
        # A cold prompt: at least half the budget uncached (a warm one is its question alone).
        self.prefill_reserve = prefill_reserve and self.prefill_budget > 0
        self.cold_tokens = max(1, self.prefill_budget // 2)
        # With the reservation: the lightest key's requests, warm ones too, go where a running
        # slot is free for them (not the headroom past the slots: that is a wait on the worker).
        self.warm_reroute = warm_reroute and self.prefill_reserve
        self._yields = yields_prefill
        self.reserved = 0  # cold prompts that had room but waited to keep a worker's prefill free
        self._contended = contended
        self.paced = 0  # requests that had a free slot but waited for the prefill budget
        self._below_share = below_share
        self._queue_args = (dict(weights or {}), aging_s, low_values_first, across_tenants)
        self._clock = clock
        self._workers: dict[str, _Slots] = {}

    def spills(self, tenant: str) -> bool:
        """Whether ``tenant``'s next request should be offered only workers with a free
        running slot (``fair_spill`` and the key below its share; the router applies it).
        Why: the fair reserve keeps a few running slots per worker, but a light key's
        requests follow its prefixes and can outnumber them on one worker; the next one
        there waits for a heavy key's request to end (its whole decode), where a worker
        with a free slot would prefill it at once, cold or not."""
        return self.fair_spill and self._below_share(tenant)

    def reserves_for(self, tenant: str) -> bool:
        """Whether ``tenant``'s cold prompt should go to a worker with no cold prefill pending
        (``prefill_reserve`` and the key does not yield: the lightest of several). The router
        applies it; the gate keeps such a worker from the keys that yield."""
        return self.prefill_reserve and not self._yields(tenant)

    def know(self, worker_ids: Iterable[str]) -> None:
        """Count ``worker_ids`` among the workers whose prefill may be free (the router
        tells it the pool it routes over): a worker nothing has entered yet is free, and
        the reservation must not hold a cold prompt for want of knowing it."""
        if self.prefill_reserve:
            for worker_id in worker_ids:
                if worker_id not in self._workers:
                    self._slots(worker_id)

    def has_room(self, worker_id: str, tenant: str) -> bool:
        """Whether ``tenant``'s request would find a slot of ``worker_id`` it may take now
        (past ``open`` only a key below its share; a worker nothing has entered yet has room).
        With ``warm_reroute`` only a running slot counts: one let through into the headroom
        waits in the worker's first-come queue for a running request to end."""
        slots = self._workers.get(worker_id)
        if slots is None or slots.cap <= 0:
            return True
        if not self._below_share(tenant):
            return slots.through < slots.open
        return slots.through < slots.cap - (self.headroom if self.warm_reroute else 0)

    def cold_pending(self, worker_id: str) -> int:
        """Cold prompts let through to ``worker_id`` with no first message yet."""
        slots = self._workers.get(worker_id)
        return slots.cold if slots else 0

    def _keeps_free(self, slots: _Slots, tenant: str, tokens: int) -> bool:
        """Whether ``tenant``'s cold prompt must wait so that some worker keeps no cold
        prefill pending: it would take the last such worker, and the key yields."""
        if not self.prefill_reserve or tokens < self.cold_tokens or slots.cold or len(self._workers) < 2:
            return False
        if any(s.cold == 0 for s in self._workers.values() if s is not slots):
            return False
        return self._yields(tenant)

    def _granted_back(self, slots: _Slots, cold: bool) -> None:
        """A slot or prefill came back to ``slots``: its waiters first; a cold prefill's end
        may free the last worker a held cold prompt elsewhere was kept off, so every queue."""
        self._grant(slots)
        if cold and self.prefill_reserve:
            for other in self._workers.values():
                if other is not slots and other.queue:
                    self._grant(other)

    def _slots(self, worker_id: str) -> _Slots:
        slots = self._workers.get(worker_id)
        if slots is None:
            weights, aging_s, low_first, across = self._queue_args
            queue = FairQueue(weights, aging_s=aging_s, low_values_first=low_first, across_tenants=across)
            slots = self._workers[worker_id] = _Slots(queue)
        return slots

    def through(self, worker_id: str) -> int:
        """Requests let through to ``worker_id`` and not ended."""
        slots = self._workers.get(worker_id)
        return slots.through if slots else 0

    def _budget(self) -> int:
        """The prefill budget in force now (0: none, or the fleet is not contended)."""
        return self.prefill_budget if self.prefill_budget and self._contended() else 0

    def prefill_pending(self, worker_id: str) -> int:
        """Predicted uncached prefill tokens let through to ``worker_id`` with no first message yet."""
        slots = self._workers.get(worker_id)
        return slots.prefill if slots else 0

    def held(self, worker_id: str | None = None) -> int:
        """Requests waiting for a slot (of ``worker_id``, or of any worker)."""
        if worker_id is not None:
            slots = self._workers.get(worker_id)
            return len(slots.queue) if slots else 0
        return sum(len(s.queue) for s in self._workers.values())

    async def enter(self, worker_id: str, running_slots: int, prefill_tokens: int = 0) -> Pass:
        """Wait until ``worker_id`` has fewer than ``running_slots + headroom`` requests let
        through (``running_slots`` 0, unknown: no wait) and room in its prefill budget for
        ``prefill_tokens`` (the request's predicted uncached prompt tokens there); returns
        the :class:`Pass` that gives them back. A waiter that is cancelled leaves the queue
        (or passes what it was granted meanwhile on)."""
        if running_slots <= 0:
            return NO_GATE
        tokens = max(0, prefill_tokens) if self.prefill_budget else 0
        slots = self._slots(worker_id)
        slots.cap = running_slots + self.headroom
        slots.open = running_slots - self.reserve if self.reserve else slots.cap
        tenant, priority = CALLER.get()
        if not slots.queue and slots.through < slots.open:
            if not slots.fits(tokens, self._budget(), self._is_cold(tokens)):
                self.paced += 1
            elif self._keeps_free(slots, tenant, tokens):
                self.reserved += 1
            else:
                return self._let_through(slots, tokens)
        waiter = _Waiter(asyncio.get_running_loop().create_future(), tokens)
        entry = slots.queue.push(tenant, priority, 1, self._clock(), waiter)
        self._grant(slots)  # a key below its share may take a reserved slot at once
        try:
            await waiter.future
        except BaseException:
            if waiter.future.done() and not waiter.future.cancelled():
                Pass(self, slots, tokens, cold=self._is_cold(tokens))()  # granted as the caller left: to the next one
            else:
                slots.queue.remove(entry)
                self._grant(slots)
            raise
        return Pass(self, slots, tokens, waited=True, cold=self._is_cold(tokens))

    def _is_cold(self, tokens: int) -> bool:
        return self.prefill_reserve and tokens >= self.cold_tokens

    def _let_through(self, slots: _Slots, tokens: int) -> Pass:
        """Count a request let through at once in ``slots`` and return its pass."""
        slots.through += 1
        slots.prefill += tokens
        cold = self._is_cold(tokens)
        slots.cold += cold
        return Pass(self, slots, tokens, cold=cold)

    def _next(self, queue: FairQueue, now: float, held_back: set[str]) -> Entry | None:
        """The next waiter in fair order; with ``share_first``, of a key below its share of
        the fleet first (one worker's queue alone takes turns between the keys waiting on
        it, whatever each of them holds of the fleet)."""
        if self.share_first:
            over = {t for t in queue.backlogged() if t not in held_back and not self._below_share(t)}
            if over:
                entry = queue.peek(now, held_back | over)
                if entry is not None:
                    return entry
        return queue.peek(now, held_back)

    def _grant(self, slots: _Slots) -> None:
        """Let waiters through in fair order while there is room; once only the reserved
        running slots are left (``open``), only keys below their share (the others are
        passed over, not dropped). A head whose prefill does not fit the budget waits for
        it, and everyone behind it too: letting smaller ones past would starve a cold one."""
        queue = slots.queue
        now = self._clock()
        held_back: set[str] = set()
        budget = self._budget() if queue else 0
        while queue and slots.through < slots.cap:
            entry = self._next(queue, now, held_back)
            if entry is None:
                return
            if slots.through >= slots.open and not self._below_share(entry.tenant):
                held_back.add(entry.tenant)
                continue
            waiter: _Waiter = entry.handle
            if waiter.future.done():  # cancelled: its own handler removes it; nothing to hand over
                queue.remove(entry)
                continue
            if not slots.fits(waiter.tokens, budget, self._is_cold(waiter.tokens)):
                return
            if self._keeps_free(slots, entry.tenant, waiter.tokens):
                held_back.add(entry.tenant)  # its key's requests here wait; a lighter key's may pass
                continue
            queue.pop(entry)
            slots.through += 1
            slots.prefill += waiter.tokens
            slots.cold += self._is_cold(waiter.tokens)
            waiter.future.set_result(None)
