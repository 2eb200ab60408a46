"""What every policy shares (policies/common.py): the explicit target worker, candidate
filtering with errors that say why, token load, and the no-op capabilities."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import pytest

from gateway.policies.base import (
    Decision,
    LoadSnapshot,
    NoWorkerAvailable,
    RouteRequest,
    WorkerView,
)
from gateway.policies.common import (
    TARGET_REASON,
    BasePolicy,
    candidates,
    find_target,
    select_target,
    token_load,
    worker_row,
)
from tests.policies.helpers import req, views


class _First(BasePolicy):
    name = "first"

    def __init__(self) -> None:
        self.asked: list[list[str]] = []

    def _choose(self, request: RouteRequest, cands: list[WorkerView]) -> Decision:
        self.asked.append([w.worker_id for w in cands])
        return Decision(cands[0].worker_id, "first")

    def _predict_cached(self, request: RouteRequest, worker: WorkerView) -> int:
        return 7

    def _explain_candidates(self, request: RouteRequest, cands: list[WorkerView]) -> dict[str, object]:
        return {"choice": cands[0].worker_id}


@pytest.mark.parametrize("target", ["w1", "grpc://10.0.0.1:30000", "10.0.0.1:30000/", " http://10.0.0.1:30000 "])
def test_a_target_is_found_by_id_or_by_url_whatever_the_scheme(target: str) -> None:
    found = find_target(target, views(3))
    assert found is not None and found.worker_id == "w1"


def test_an_id_wins_over_a_url_and_unknown_targets_are_none() -> None:
    ws = [WorkerView("grpc://10.0.0.9:1", "grpc://x:1"), WorkerView("w9", "grpc://10.0.0.9:1")]
    assert find_target("grpc://10.0.0.9:1", ws) is ws[0]
    assert find_target("nowhere:1", ws) is None


def test_a_target_that_cannot_be_used_says_why() -> None:
    ws = views(2)
    with pytest.raises(NoWorkerAvailable, match=r"'zz' is not in pool 'regular' \(workers: w0, w1\)"):
        select_target(req([1], target_worker="zz"), ws)
    with pytest.raises(NoWorkerAvailable, match="workers: none"):
        select_target(req([1], target_worker="zz"), [])
    with pytest.raises(NoWorkerAvailable, match="unavailable"):
        select_target(req([1], target_worker="w0"), [replace(ws[0], available=False)])
    with pytest.raises(NoWorkerAvailable, match="already failed"):
        select_target(req([1], target_worker="w0", exclude=frozenset({"w0"})), ws)


def test_candidates_are_the_available_workers_not_excluded() -> None:
    ws = views(4)
    ws[1] = replace(ws[1], available=False)
    assert [w.worker_id for w in candidates(req([1]), ws)] == ["w0", "w2", "w3"]
    assert [w.worker_id for w in candidates(req([1], exclude=frozenset({"w0", "w3"})), ws)] == ["w2"]
    with pytest.raises(NoWorkerAvailable, match="no worker registered in pool 'decode'"):
        candidates(req([1], pool="decode"), [])
    with pytest.raises(NoWorkerAvailable, match=r"none of the 4 workers .* \(excluded: w0, w2, w3\)"):
        candidates(req([1], exclude=frozenset({"w0", "w2", "w3"})), ws)


def test_token_load_prefers_the_workers_own_figures() -> None:
    own = WorkerView("w", "u", queued_prefill_tokens=10, remote_prefill_tokens=5, running_decode_tokens=20)
    assert token_load(own) == 35
    polled = replace(own, loads=LoadSnapshot(num_used_tokens=100, num_waiting_uncached_tokens=3, age_s=0.5))
    assert token_load(polled) == 103
    row = worker_row(polled)
    assert row["polled_used_tokens"] == 100 and row["polled_age_s"] == 0.5 and row["in_flight"] == 0
    assert "polled_used_tokens" not in worker_row(own)


def test_select_honours_the_target_before_the_policy() -> None:
    policy = _First()
    decision = policy.select(req([1], target_worker="w2"), views(3))
    assert (decision.worker_id, decision.reason, decision.predicted_cached_tokens) == ("w2", TARGET_REASON, 7)
    assert policy.asked == []  # the subclass was not asked
    assert policy.select(req([1], exclude=frozenset({"w0"})), views(3)).worker_id == "w1"
    assert policy.asked == [["w1", "w2"]]


def test_explain_shows_the_choice_or_the_error_without_choosing() -> None:
    policy = _First()
    out = policy.explain(req([1]), views(2))
    assert out["policy"] == "first" and out["choice"] == "w0" and set(out["workers"]) == {"w0", "w1"}
    assert policy.explain(req([1], target_worker="w1"), views(2))["reason"] == TARGET_REASON
    assert "not in pool" in policy.explain(req([1], target_worker="zz"), views(2))["error"]
    assert "no worker registered" in policy.explain(req([1]), [])["error"]
    assert policy.asked == []


def test_the_optional_capabilities_are_safe_no_ops() -> None:
    policy = _First()
    r = req([1, 2])
    d = Decision("w0", "x")
    results: Sequence[object] = [
        policy.on_dispatch(r, d), policy.on_finish(r, "w0", 1, True), policy.on_workers_changed(views(1)),
        policy.on_output(r, "w0", [3]), policy.packed(r), policy.set_load_only("m", True), policy.close(),
    ]
    assert list(results) == [None] * 7
    assert policy.quality() == {} and not policy.remote_finishes and not policy.learn_output
    policy.close()  # twice is fine
