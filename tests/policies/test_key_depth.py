"""KeyDepths: the ladder, keys per rung, and going deeper when a key is too common."""

from __future__ import annotations

import pytest

from gateway.policies.hashing import prefix_key
from gateway.policies.key_depth import KeyDepths, ladder

from .helpers import tokens


def test_ladder_doubles_up_to_the_cap() -> None:
    assert ladder(256, 2048) == (256, 512, 768, 1024, 1280, 1536, 1792, 2048)
    assert ladder(256, 100) == (256,)


def test_keys_are_the_prefix_keys_of_each_rung_up_to_the_prompt_length() -> None:
    kd = KeyDepths(16, 64, 512)
    prompt = tokens(200, 1)
    keys = kd.keys(prompt)
    assert keys == tuple(prefix_key(prompt, 16, d) for d in (64, 128, 192, 256))  # 256 is past 200: last rung
    assert kd.keys([1, 2, 3]) == (prefix_key([1, 2, 3], 16, 64),)


def test_a_key_over_one_workers_share_sends_the_prompt_deeper() -> None:
    kd = KeyDepths(16, 64, 1024, window=64)
    shared = tokens(64, 2)
    prompts = [shared + tokens(192, 100 + i) for i in range(64)]
    picks = []
    for p in prompts:
        keys = kd.keys(p)
        picks.append(kd.pick(keys, 8))
        kd.record(keys)
    # the shared 64 tokens stay the key until they carry over 64 / 8 = 8 of the window
    assert picks[:9] == [0] * 9 and set(picks[9:]) == {1}
    assert kd.share(kd.keys(prompts[0])[0]) == 1.0
    # an uncommon prefix still keys at the base depth
    assert kd.pick(kd.keys(tokens(256, 5)), 8) == 0


def test_when_every_rung_is_common_the_deepest_is_used_and_the_window_slides() -> None:
    kd = KeyDepths(16, 32, 64, window=16)  # rungs 32 and 64
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
