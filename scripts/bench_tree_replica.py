"""CPU per request of the ``cache_aware`` tree in one serving process of a set, in memory.

Why: with ``--processes N`` (or synced replicas) every process's tree takes every
process's decisions and learned outputs, so each one does the tree work of the whole
set's traffic and evicts for it. This replays the throughput benchmark's load (short
chat prompts that share only the chat template and a zero-padded counter, 8 output
tokens, 4 workers of 65,536 KV tokens, page 16) through the policy's real hooks, one
thread, and prints the policy's CPU time per request of the set:

* ``one``: every request is this process's own (select, dispatch, learned output);
* ``set-of-N``: 1 in N is its own, the rest arrive as remote decisions and outputs.

Eviction runs as the background evictor would (``--evict-every`` requests, one
``evict()`` call on each tree that is over budget), or inline (``--inline``). Pure CPU
in one process: no lock needed, figures are process CPU time (robust to neighbours).

    .venv/bin/python scripts/bench_tree_replica.py --requests 60000
"""

from __future__ import annotations

import argparse
import random
import time

from gateway.policies.base import RemoteDecision, RouteRequest, WorkerView
from gateway.policies.cache_aware import CacheAwarePolicy
from gateway.policies.radix_tree import pack

TEMPLATE = [151644, 872, 198]  # <|im_start|>user\n
SUFFIX = [151645, 198, 151644, 77091, 198]  # <|im_end|>\n<|im_start|>assistant\n
OUTPUT = [264, 20866, 9851, 504, 264, 7168, 40138, 2498]  # the canned fleet's 8 tokens


def prompts(n: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [TEMPLATE + [15 + int(d) for d in f"{i:08d}"] + [rng.randrange(1000, 60000) for _ in range(24)] + SUFFIX
            for i in range(n)]  # fmt: skip


def run(label: str, share: int, args: argparse.Namespace, data: list[list[int]]) -> dict[str, float]:
    """Replay ``data``; this process serves request i when i % share == 0."""
    policy = CacheAwarePolicy(eviction_interval_s=0 if args.inline else 3600.0, eviction_low_watermark=args.low_watermark)
    views = [WorkerView(f"w{k}", f"w{k}", kv_capacity_tokens=args.kv_tokens, page_size=16) for k in range(args.workers)]
    policy.on_workers_changed(views)
    tree = policy.tree("m")
    evict_s = 0.0
    passes = evicted = 0
    t0 = time.process_time()
    for i, toks in enumerate(data):
        if i % share == 0:
            req = RouteRequest(toks, model="m", request_id=str(i))
            d = policy.select(req, views)
            policy.on_dispatch(req, d)
            policy.on_output(req, d.worker_id, OUTPUT)
            policy.on_finish(req, d.worker_id, 0, True)
        else:
            w = f"w{i % args.workers}"
            pb = pack(toks)
            policy.on_remote(RemoteDecision(w, "m", pb, len(toks)))
            whole = (len(toks) + len(OUTPUT)) // 16 * 16
            policy.on_remote(RemoteDecision(w, "m", pb + pack(OUTPUT[: whole - len(toks)])))
        if not args.inline and i % args.evict_every == args.evict_every - 1:
            e0 = time.process_time()
            for t in policy.trees():
                if t.over_budget():
                    passes += 1
                    evicted += t.evict()
            evict_s += time.process_time() - e0
    total = time.process_time() - t0
    policy.close()
    tree.validate()
    n = len(data)
    out = {"us_per_request": 1e6 * total / n, "evict_us_per_request": 1e6 * evict_s / n, "passes": passes,
           "nodes_evicted_per_pass": evicted / passes if passes else 0.0, "tree_tokens": tree.total_tokens,
           "nodes": tree.node_count, "heap_entries": tree.stats().heap_entries}  # fmt: skip
    print(f"{label:10s} " + "  ".join(f"{k} {v:.2f}" if isinstance(v, float) else f"{k} {v}" for k, v in out.items()))
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--requests", type=int, default=60000)
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--kv-tokens", type=int, default=65536)
    p.add_argument("--set", type=int, default=2, help="processes in the set")
    p.add_argument("--evict-every", type=int, default=750, help="requests between evictor passes (0.5 s at 1500/s)")
    p.add_argument("--inline", action="store_true", help="evict inline on insert instead")
    p.add_argument("--low-watermark", type=float, default=1.0, help="background passes evict down to this fraction of a budget")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--seed", type=int, default=1)
    args = p.parse_args()
    data = prompts(args.requests, args.seed)
    best: dict[str, float] = {}
    for _ in range(args.repeat):
        for label, share in (("one", 1), (f"set-of-{args.set}", args.set)):
            r = run(label, share, args, data)
            best[label] = min(best.get(label, float("inf")), r["us_per_request"])
    print("best µs per request of the set:", {k: round(v, 2) for k, v in best.items()})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
