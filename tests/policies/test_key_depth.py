"""KeyDepths: the ladder, keys per rung, and going deeper when a key is too common."""

from __future__ import annotations

import pytest

from gateway.policies.hashing import prefix_key
from gateway.policies.key_depth import MIN_SAMPLES, KeyDepths, ladder

from .helpers import tokens


def test_ladder_doubles_up_to_the_cap() -> None:
    assert ladder(256, 2048) == (256, 512, 768, 1024, 1280, 1536, 1792, 2048)
    assert ladder(256, 100) == (256,)


def test_rung_keys_chain_whole_blocks_up_to_the_prompt_length() -> None:
    kd = KeyDepths(16, 64, 512)
    prompt = tokens(200, 1)
    keys = kd.keys(prompt)
    assert len(keys) == 3 and keys[0] == prefix_key(prompt, 16, 64)  # 64, 128, 192: 200 has no more whole blocks
    longer = kd.keys(prompt + tokens(20, 3))  # 220 tokens: the 256 rung holds its blocks up to 208
    assert len(longer) == 4 and longer[:3] == keys
    # prompts sharing their first 128 tokens share two rungs, and differ after
    other = prompt[:128] + tokens(72, 2)
    assert kd.keys(other)[:2] == keys[:2] and kd.keys(other)[2] != keys[2]
    assert kd.keys([1, 2, 3]) == (prefix_key([1, 2, 3], 16, 64),)
    assert KeyDepths(16, 64, 512).keys(prompt) == keys  # the same in every process


def test_a_key_over_one_workers_share_sends_the_prompt_deeper() -> None:
    kd = KeyDepths(16, 64, 1024, window=64, max_share=0.125)
    shared = tokens(64, 2)
    prompts = [shared + tokens(192, 100 + i) for i in range(64)]
    picks = []
    for p in prompts:
        keys = kd.keys(p)
        walked = kd.route(p, 8)
        picks.append(kd.pick(keys, 8))
        assert walked == keys[: picks[-1] + 1]  # route walks only as deep as it must
        kd.record(walked)
    # the shared 64 tokens stay the key until enough requests carried them (MIN_SAMPLES)
    assert picks[:MIN_SAMPLES] == [0] * MIN_SAMPLES and set(picks[MIN_SAMPLES:]) == {1}
    assert kd.share(kd.keys(prompts[0])[0]) == 1.0
    # an uncommon prefix still keys at the base depth
    assert kd.pick(kd.keys(tokens(256, 5)), 8) == 0


def test_when_every_rung_is_common_the_deepest_is_used_and_the_window_slides() -> None:
    kd = KeyDepths(16, 32, 64, window=16, max_share=0.25)  # rungs 32 and 64
    same = tokens(64, 3)
    for _ in range(16):
        kd.record(kd.keys(same))
    assert kd.pick(kd.keys(same), 4) == 1  # both rungs are common: the deepest
    for i in range(16):  # other traffic pushes it out of the window
        kd.record(kd.keys(tokens(64, 50 + i)))
    assert kd.pick(kd.keys(same), 4) == 0 and kd.share(kd.keys(same)[0]) == 0.0


def test_window_zero_is_the_fixed_depth() -> None:
    kd = KeyDepths(16, 64, 1024, window=0)
    same = tokens(300, 4)
    for _ in range(10):
        kd.record(kd.keys(same))
    assert kd.depths == (64,) and kd.pick(kd.keys(same), 8) == 0
    with pytest.raises(ValueError):
        KeyDepths(16, 64, window=-1)
    with pytest.raises(ValueError):
        KeyDepths(16, 64, max_share=0)


def test_a_popular_key_below_the_share_keeps_its_depth_and_small_pools_floor_it() -> None:
    kd = KeyDepths(16, 64, 1024, window=100)  # default: over half the window is "everyone"
    hot, cold = tokens(64, 7), tokens(64, 8)
    for i in range(100):
        kd.record(kd.route((hot if i % 10 < 4 else cold) + tokens(64, 200 + i), 8))
    assert kd.pick(kd.keys(hot + tokens(64, 9)), 8) == 0  # 40%: bounded load spreads it, not depth
    assert kd.max_share_for(8) == 0.5 and kd.max_share_for(1) == 1.0


def test_a_long_shared_header_is_passed_a_few_requests_per_rung() -> None:
    kd = KeyDepths(16, 64, 1024, window=256)
    header = tokens(256, 10)  # four rungs deep
    depths = []
    for i in range(100):
        walked = kd.route(header + tokens(64, 300 + i), 8)
        depths.append(len(walked))
        kd.record(walked)
    assert depths[-1] == 5 and depths.index(5) <= 4 * MIN_SAMPLES + 1
