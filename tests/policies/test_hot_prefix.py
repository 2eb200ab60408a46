"""Hot prefixes (policies/hot_prefix.py): decayed load shares per prefix key, how many
workers a hot prefix needs, its ordered replica set, and the bounds on what is tracked."""

from __future__ import annotations

import math

import pytest

from gateway.policies.hot_prefix import (
    MIN_REQUESTS,
    NOISE_Z,
    SLACK,
    TOP_MIN_REQUESTS,
    HotPrefixes,
    sure_count,
)


def _feed(hot: HotPrefixes, pattern: list[int], rounds: int, n_workers: int = 0) -> None:
    for _ in range(rounds):
        for key in pattern:
            hot.observe(key, n_workers)


def test_shares_follow_the_recent_traffic() -> None:
    hot = HotPrefixes(window=64)
    assert hot.share(1) == 0.0 and hot.cold_share() == 1.0
    _feed(hot, [1, 1, 1, 2], rounds=100)
    assert hot.share(1) == pytest.approx(0.75, abs=0.03) and hot.share(2) == pytest.approx(0.25, abs=0.03)
    _feed(hot, [2], rounds=300)  # the traffic moved: old counts decay away
    assert hot.share(1) < 0.01 and hot.share(2) > 0.99
    assert hot.share(99) == 0.0


def test_one_worker_until_enough_requests_and_above_the_slack() -> None:
    hot = HotPrefixes(window=256)
    _feed(hot, [7], rounds=10)
    assert hot.replicas(7, 8) == 1  # all of 10 requests, but too few seen for a share to mean anything
    _feed(hot, [7], rounds=MIN_REQUESTS)
    assert hot.replicas(7, 1) == 1  # one worker: nothing to replicate to
    assert hot.replicas(7, 8) == 8  # all the traffic: every worker


def test_replicas_are_the_load_in_fair_shares_with_slack_and_headroom() -> None:
    hot = HotPrefixes(window=128)
    _feed(hot, [1, 1, 2, 3, 4, 5, 6, 7], rounds=200, n_workers=8)  # key 1 carries a quarter
    share = hot.share(1)
    assert share == pytest.approx(0.25, abs=0.03)
    expected = math.ceil(share * 8 - SLACK + 0.5 * hot.cold_share())
    assert hot.replicas(1, 8) == expected and 2 <= expected <= 3
    assert hot.replicas(2, 8) == 1  # an eighth of the traffic on eight workers is not hot
    assert 0.7 < hot.cold_share() < 0.8  # everything but key 1 is cold
    assert [key for key, _, _ in hot.hot(8)] == [1]


def test_the_top_load_waits_for_enough_requests_and_discounts_sampling_luck() -> None:
    hot = HotPrefixes(window=256)
    _feed(hot, [5], rounds=TOP_MIN_REQUESTS - 1)
    assert hot.top_load(4) is None
    hot.observe(5)
    n = TOP_MIN_REQUESTS  # all of them one key: its count less two standard deviations
    assert hot.top_load(4) == pytest.approx(4 * (n - 2 * math.sqrt(n)) / n, rel=0.05)
    uniform = HotPrefixes(window=256)
    for key in range(64):
        uniform.observe(key)
    top = uniform.top_load(4)
    assert top is not None and top == 0.0  # 64 prefixes seen once each: nothing is hot
    even = HotPrefixes(window=256)
    for i in range(48):
        even.observe(i % 16 if i % 8 else 3)  # 16 even groups, key 3 the luckiest: 8 of 48
    top = even.top_load(16)
    assert top is not None and top < 1.0  # read at face value, 2.7 workers' worth


def test_requests_without_a_key_count_as_spread_traffic_after_more_of_them() -> None:
    """Unrelated prompts (no shared prefix to key) move no share, but enough of them are
    evidence the traffic is spread: the top load is read after MIN_REQUESTS of any kind
    (TOP_MIN_REQUESTS keyed ones as before), and it is 0 while none had a key."""
    cold = HotPrefixes(window=256)
    for _ in range(MIN_REQUESTS - 1):
        cold.observe(None, 8)
    assert cold.top_load(8) is None  # a burst's first, keyless requests say little yet
    cold.observe(None, 8)
    assert cold.top_load(8) == 0.0 and cold.cold_share() == 1.0 and len(cold) == 0
    mixed = HotPrefixes(window=64)
    for i in range(MIN_REQUESTS):
        mixed.observe(1 if i % 16 == 0 else None, 8)  # four repeats of one document
    assert mixed.share(1) == 1.0  # the only keyed traffic ...
    top = mixed.top_load(8)
    assert top is not None and top < 1.0  # ... but four requests are no evidence it is hot
    keyed = HotPrefixes(window=256)
    _feed(keyed, [5], rounds=TOP_MIN_REQUESTS)
    assert keyed.top_load(4) is not None  # keyed requests: read as soon as before


def test_sure_count_is_the_count_less_its_noise() -> None:
    assert sure_count(0) == 0.0 and sure_count(4) == 0.0 and sure_count(-1) == 0.0
    assert sure_count(100) == pytest.approx(100 - NOISE_Z * 10)


def test_holders_keep_their_order_and_departed_workers_are_forgotten() -> None:
    hot = HotPrefixes()
    assert hot.holders(3) == []
    for w in ["w2", "w0", "w2", "w5"]:
        hot.add_holder(3, w)
    assert hot.holders(3) == ["w2", "w0", "w5"]
    hot.holders(3).append("w9")  # a copy: the set is unchanged
    hot.drop_workers(["w0", "w7"])
    assert hot.holders(3) == ["w2", "w5"]


def test_tracking_is_bounded_and_drops_the_coldest() -> None:
    hot = HotPrefixes(window=64, max_tracked=16)
    _feed(hot, [0], rounds=50)
    for key in range(1, 40):
        hot.observe(key)
    assert len(hot) <= 16
    assert hot.share(0) > 0  # the hot key survived the trims
    assert hot.top_load(2) is not None


def test_a_window_below_one_request_is_refused() -> None:
    with pytest.raises(ValueError, match="window"):
        HotPrefixes(window=0)
