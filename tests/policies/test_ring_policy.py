"""The hash-ring machinery (policies/ring_policy.py): the ring follows the pool, the load
bound, and the walk's reasons (owner, owner unavailable, load bounded)."""

from __future__ import annotations

from gateway.policies.base import Decision, RouteRequest, WorkerView
from gateway.policies.ring_policy import RingPolicy
from tests.policies.helpers import req, views, with_load


class _Keyed(RingPolicy):
    """Routes every request by one fixed key, with a load bound."""

    name = "keyed"

    def __init__(self, key: int, load_factor: float = 0.0) -> None:
        super().__init__(virtual_nodes=16)
        self.key = key
        self.load_factor = load_factor

    def _choose(self, request: RouteRequest, cands: list[WorkerView]) -> Decision:
        w, reason, _ = self.walk(self.key, cands, self.load_limit(cands, self.load_factor))
        return Decision(w.worker_id, reason)


def test_load_limit_is_the_scaled_average_counting_this_request() -> None:
    ws = [WorkerView(f"w{i}", "u", in_flight=n) for i, n in enumerate([3, 1, 0, 0])]
    assert RingPolicy.load_limit(ws, 0.0) is None and RingPolicy.load_limit(ws, -1) is None
    assert RingPolicy.load_limit(ws, 1.0) == 2  # ceil(1.0 * 5 / 4)
    assert RingPolicy.load_limit(ws, 1.25) == 2  # ceil(1.5625)
    assert RingPolicy.load_limit([WorkerView("w", "u")], 0.1) == 1  # never below one request


def test_the_walk_says_why_it_did_not_take_the_owner() -> None:
    policy = _Keyed(key=12345)
    ws = views(4)
    owner = policy.select(req([1]), ws)
    assert owner.reason == "ring_owner"
    down = policy.select(req([1]), with_load(ws, owner.worker_id, available=False))
    assert down.reason == "owner_unavailable" and down.worker_id != owner.worker_id
    loaded = _Keyed(key=12345, load_factor=1.0)
    busy = loaded.select(req([1]), with_load(ws, owner.worker_id, in_flight=10))
    assert busy.reason == "load_bounded" and busy.worker_id != owner.worker_id


def test_the_ring_keeps_unavailable_workers_so_keys_come_back() -> None:
    policy = _Keyed(key=999)
    ws = views(3)
    owner = policy.select(req([1]), ws).worker_id
    policy.select(req([1]), with_load(ws, owner, available=False))
    assert policy.ring.members == frozenset({"w0", "w1", "w2"})  # an outage is not a membership change
    assert policy.select(req([1]), ws).worker_id == owner


def test_membership_changes_resync_the_ring_and_positions_are_reported() -> None:
    policy = _Keyed(key=1)
    policy.on_workers_changed(views(2))
    assert policy.ring.members == frozenset({"w0", "w1"})
    points = policy.ring_points()
    assert len(points) == 2 * 16 and points == sorted(points) and {w for _, w in points} == {"w0", "w1"}
    pos = policy.ring_position(1)
    assert pos.owner in {"w0", "w1"}
    policy.explain(req([1]), views(3))  # explain sees the pool too
    assert policy.ring.members == frozenset({"w0", "w1", "w2"})
