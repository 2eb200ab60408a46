"""The request models' shared bounds: the message count is refused before any item is read."""

from __future__ import annotations

import pytest

from gateway.protocol import limits


def test_check_message_count_passes_lists_within_the_bound_and_anything_else() -> None:
    within = [{}] * limits.MAX_MESSAGES
    assert limits.check_message_count(within) is within
    assert limits.check_message_count("not a list") == "not a list"  # the model's own check refuses it
    with pytest.raises(ValueError, match=f"input may hold at most {limits.MAX_MESSAGES} messages, not"):
        limits.check_message_count([*within, {}], "input")


def test_the_count_names_its_limit_and_noun() -> None:
    items = [{}] * (limits.MAX_INPUT_ITEMS + 1)
    with pytest.raises(ValueError, match=f"input may hold at most {limits.MAX_INPUT_ITEMS} items, not"):
        limits.check_message_count(items, "input", limits.MAX_INPUT_ITEMS, "items")
    assert limits.check_message_count(items[:2], "input", 2, "items") == items[:2]
