"""gateway_lab.bench.placement: each shared-prefix miss of a run, classified by cause."""

from __future__ import annotations

from gateway_lab.bench.driver import RequestResult
from gateway_lab.bench.placement import KINDS, classify_misses


def r(index: int, group: str, worker: str, start: float, cached: int, ttft: float = 0.1,
      prompt: int = 2176, ok: bool = True) -> RequestResult:
    return RequestResult(index=index, group=group, ok=ok, start_s=start, ttft_s=ttft, prompt_tokens=prompt,
                         cached_tokens=cached, worker_id=worker)


def test_each_kind_of_prefix_miss() -> None:
    results = [
        r(0, "g0", "w0", 0.00, 0),  # the group's first: unavoidable
        r(1, "g0", "w1", 0.01, 0),  # replica 1, 10 ms later: had not heard of w0 -> blind
        r(2, "g0", "w0", 0.05, 2048),  # a hit
        r(4, "g0", "w2", 1.00, 0),  # replica 0 knew w0 (its own): a spill
        r(6, "g0", "w2", 1.02, 0),  # w2's first request of g0 has no first token yet: duplicate
        r(8, "g0", "w0", 5.00, 0),  # w0 answered g0 long ago: evicted
        r(10, "g1", "w3", 0.00, 0),
        r(3, "g1", "w4", 0.50, 0),  # replica 1, but replica 0's placement is 500 ms old: informed
        r(12, "g1", "w3", 0.60, 0, ok=False),  # failed requests are not classified
    ]
    out = classify_misses(results, shared_tokens=2048, replicas=2, lag_s=0.05)
    assert out.requests == {"first": 2, "blind_new_holder": 1, "informed_new_holder": 2, "duplicate": 1, "evicted": 1}
    assert out.tokens["first"] == 2 * 2176 and out.tokens["duplicate"] == 2176
    assert sorted(out.holders) == [2, 3]
    d = out.as_dict()
    assert d["holders_max"] == 3 and d["holders_mean"] == 2.5
    assert set(d["misses"]) == set(KINDS)  # type: ignore[arg-type]
    assert out.row() == "2 / 1 / 2 / 1 / 1"


def test_one_replica_never_misses_blind_and_hits_are_not_counted() -> None:
    results = [
        r(0, "g0", "w0", 0.0, 0),
        r(1, "g0", "w1", 0.001, 0),  # one process knew w0 at once: informed
        r(2, "g0", "w0", 0.2, 2048),
        r(3, "g0", "w0", 0.3, 1990),  # within the 64-token page-rounding margin: a hit
    ]
    out = classify_misses(results, shared_tokens=2048)
    assert out.requests["blind_new_holder"] == 0 and out.requests["informed_new_holder"] == 1
    assert sum(out.requests.values()) == 2


def test_requests_without_a_group_or_a_worker_are_skipped() -> None:
    results = [r(0, "", "w0", 0.0, 0), RequestResult(index=1, group="g0", ok=True, cached_tokens=0)]
    out = classify_misses(results, shared_tokens=2048)
    assert sum(out.requests.values()) == 0 and out.holders == []
