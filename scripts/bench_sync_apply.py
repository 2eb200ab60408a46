"""CPU per request of the sync's two halves in memory: publishing (tap + outbox + encode) and applying.

Why: in a ``--processes 2`` set every child encodes its own decisions and applies the
other child's, and the apply puts each of them into its own tree (which later evicts
them). This replays the throughput benchmark's load (short chat prompts sharing only the
chat template and a zero-padded counter, 8 output tokens, 4 workers of 65,536 KV tokens,
page 16) through the real pieces, in one thread, with no NATS in between:

* origin: ``TappedPolicy`` over a ``cache_aware`` policy feeding an ``Outbox``; a batch is
  taken and serialized every ``--batch`` requests (a 5 ms window at saturation), and a
  request's output and finish come ``--lag`` requests after its decision (its life at
  saturation), so most outputs travel as extensions of their decisions, as in the set;
* receiver: ``Applier.apply_bytes`` into another ``cache_aware`` policy's tree, whose
  evictor pass runs every ``--evict-every`` requests (0.5 s at 1,500 requests/s).

Printed per request: the origin's sync work (the tap's sink and the batch encode, its
own policy excluded), the receiver's apply (decode, book, tree inserts) and its eviction,
as process CPU time (robust to neighbours; no benchmark lock needed). ``--check`` also
builds a third tree told every decision and output directly (each batch decoded as whole
sequences, one plain insert each, in the batch's order) and asserts the receiver's tree
equals it node for node, stamps included. Run it with another checkout's ``src`` on ``PYTHONPATH``
to compare builds.

    .venv/bin/python scripts/bench_sync_apply.py --requests 40000 --repeat 3
"""

from __future__ import annotations

import argparse
import random
import time
from collections import deque
from types import SimpleNamespace
from typing import Any

from gateway.policies.base import Decision, RemoteDecision, RouteRequest, WorkerView
from gateway.policies.cache_aware import CacheAwarePolicy
from gateway.proto import sync_pb2
from gateway.server.gc_policy import tune_gc
from gateway.sync.apply import Applier
from gateway.sync.outbox import Outbox
from gateway.sync.policy_tap import TappedPolicy
from gateway.sync.prefix_book import PrefixBook
from gateway.workers.load import WorkerLoad

TEMPLATE = [151644, 872, 198]  # <|im_start|>user\n
SUFFIX = [151645, 198, 151644, 77091, 198]  # <|im_end|>\n<|im_start|>assistant\n
OUTPUT = [264, 20866, 9851, 504, 264, 7168, 40138, 2498]  # the canned fleet's 8 tokens
PAGE = 16


def prompts(n: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [TEMPLATE + [15 + int(d) for d in f"{i:08d}"] + [rng.randrange(1000, 60000) for _ in range(24)] + SUFFIX
            for i in range(n)]  # fmt: skip


class _Workers:
    def __init__(self, ids: list[str]) -> None:
        self.w = {wid: SimpleNamespace(id=wid, model="m", role="regular", load=WorkerLoad(), remote_load=WorkerLoad(),
                                       info=SimpleNamespace(page_size=PAGE)) for wid in ids}  # fmt: skip

    def get(self, wid: str) -> Any:
        return self.w.get(wid)

    def all(self) -> list[Any]:
        return list(self.w.values())


class _Router:
    def __init__(self, p: CacheAwarePolicy) -> None:
        self.p = p

    def policy(self, model: str, role: str) -> CacheAwarePolicy:
        return self.p


def _policy(views: list[WorkerView]) -> CacheAwarePolicy:
    p = CacheAwarePolicy(eviction_interval_s=3600.0)  # evicted by hand below, as the thread would
    p.on_workers_changed(views)
    return p


class _Timed:
    """The outbox with its CPU time counted (the tap's sink calls and the batch encode)."""

    def __init__(self, box: Outbox) -> None:
        self.box, self.s = box, 0.0

    def dispatched(self, *a: Any) -> None:
        t = time.process_time()
        self.box.dispatched(*a)
        self.s += time.process_time() - t

    def learned(self, *a: Any) -> None:
        t = time.process_time()
        self.box.learned(*a)
        self.s += time.process_time() - t

    def finished(self, *a: Any) -> None:
        t = time.process_time()
        self.box.finished(*a)
        self.s += time.process_time() - t

    def take(self) -> bytes | None:
        t = time.process_time()
        batch = self.box.take()
        data = None if batch is None else batch.SerializeToString()
        self.s += time.process_time() - t
        return data


def run(args: argparse.Namespace, data: list[list[int]]) -> dict[str, float]:
    ids = [f"w{k}" for k in range(args.workers)]
    views = [WorkerView(w, w, kv_capacity_tokens=args.kv_tokens, page_size=PAGE) for w in ids]
    origin, receiver = _policy(views), _policy(views)
    expect = _policy(views) if args.check else None
    workers = _Workers(ids)
    box = _Timed(Outbox("a", lambda wid: workers.get(wid).load, lambda wid: PAGE, book=PrefixBook()))
    applier = Applier("b", _Router(receiver), workers, book=PrefixBook())
    tap = TappedPolicy(origin, "regular", box)  # type: ignore[arg-type]
    apply_s = evict_s = 0.0
    open_reqs: deque[tuple[RouteRequest, Decision]] = deque()
    nbytes = 0

    ref_book, ref_known = PrefixBook(), {}

    def reference(raw: bytes) -> None:
        """The same batch told to ``expect`` as whole sequences, one insert each, in order."""
        assert expect is not None
        for d in sync_pb2.Batch.FromString(raw).decisions:
            if d.extends:
                wid, wire = ref_known[d.extends]
                wire += d.tokens
            else:
                wid = d.worker_id
                wire = ref_book.decode(d.prefix_hash, d.prefix_blocks, d.tokens, d.block_tokens or ref_book.block_tokens)
                assert wire is not None
            ref_known[d.id or -1] = (wid, wire)
            expect.on_remote(RemoteDecision(wid, "m", wire))

    def apply(raw: bytes | None) -> None:
        nonlocal apply_s, nbytes
        if raw is None:
            return
        nbytes += len(raw)
        t = time.process_time()
        applier.apply_bytes(raw)
        apply_s += time.process_time() - t
        if expect is not None:
            reference(raw)

    def finish(req: RouteRequest, dec: Decision) -> None:
        tap.on_output(req, dec.worker_id, OUTPUT)
        tap.on_finish(req, dec.worker_id, 0, True)

    for i, toks in enumerate(data):
        req = RouteRequest(toks, model="m", request_id=str(i))
        dec = tap.select(req, views)
        tap.on_dispatch(req, dec)
        open_reqs.append((req, dec))
        if len(open_reqs) > args.lag:
            finish(*open_reqs.popleft())
        if i % args.batch == args.batch - 1:
            apply(box.take())
        if i % args.evict_every == args.evict_every - 1:
            t = time.process_time()
            for tree in receiver.trees():
                if tree.over_budget():
                    tree.evict()
            if expect is not None:
                for tree in expect.trees():
                    if tree.over_budget():
                        tree.evict()
            evict_s += time.process_time() - t
    while open_reqs:
        finish(*open_reqs.popleft())
    apply(box.take())
    st = applier.stats
    assert st.unresolved == st.unresolved_finishes == st.skipped == st.lost_batches == 0, st
    if expect is not None:
        got, want = receiver.tree("m"), expect.tree("m")
        got.validate()
        assert [(x.start, x.end, x.tokens, x.workers) for x in sorted(got.nodes(), key=lambda x: (x.start, x.tokens))] == [
            (x.start, x.end, x.tokens, x.workers) for x in sorted(want.nodes(), key=lambda x: (x.start, x.tokens))
        ], "the receiver's tree differs from one told every decision directly"
    for p in (origin, receiver, *([expect] if expect else [])):
        p.close()
    n = len(data)
    return {"publish_us": 1e6 * box.s / n, "apply_us": 1e6 * apply_s / n, "evict_us": 1e6 * evict_s / n,
            "bytes": nbytes / n, "extensions": st.extensions}  # fmt: skip


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--requests", type=int, default=40000)
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--kv-tokens", type=int, default=65536)
    p.add_argument("--batch", type=int, default=16, help="requests per published batch (one 5 ms window)")
    p.add_argument("--lag", type=int, default=40, help="requests between a decision and its output and finish")
    p.add_argument("--evict-every", type=int, default=750, help="requests between evictor passes")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--check", action="store_true", help="also assert the receiver's tree equals one told directly")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--gc-young-threshold", type=int, default=50_000, help="as serve's flag of that name")
    args = p.parse_args()
    data = prompts(args.requests, args.seed)
    tune_gc(args.gc_young_threshold)  # the collector as a serving process runs it
    best: dict[str, float] = {}
    for _ in range(args.repeat):
        r = run(args, data)
        print("  ".join(f"{k} {v:.2f}" if isinstance(v, float) else f"{k} {v}" for k, v in r.items()), flush=True)
        for k in ("publish_us", "apply_us", "evict_us"):
            best[k] = min(best.get(k, float("inf")), r[k])
    print("best µs per request:", {k: round(v, 2) for k, v in best.items()})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
