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
