"""Small builders shared by the policy tests."""

from __future__ import annotations

import random
from dataclasses import replace

from gateway.policies.base import RouteRequest, WorkerView


def views(n: int, **kw: object) -> list[WorkerView]:
    return [WorkerView(f"w{i}", f"grpc://10.0.0.{i}:30000", **kw) for i in range(n)]  # type: ignore[arg-type]


def with_load(ws: list[WorkerView], wid: str, **kw: object) -> list[WorkerView]:
    return [replace(w, **kw) if w.worker_id == wid else w for w in ws]  # type: ignore[arg-type]


def tokens(n: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(1, 150_000) for _ in range(n)]


def req(toks: list[int], **kw: object) -> RouteRequest:
    return RouteRequest(token_ids=toks, **kw)  # type: ignore[arg-type]
