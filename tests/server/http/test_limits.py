"""The HTTP connection limits: defaults that keep well-behaved clients whole, and checked bounds."""

from __future__ import annotations

import httpx
import openai._constants
import pytest

from gateway.server.http.limits import HttpLimitsConfig


def test_idle_keep_alive_outlives_the_pools_of_common_clients() -> None:
    """A server that closes an idle connection first races the client's next request on it."""
    default = HttpLimitsConfig().keep_alive_timeout_s
    assert default > httpx.Limits().keepalive_expiry
    assert default > openai._constants.DEFAULT_CONNECTION_LIMITS.keepalive_expiry


@pytest.mark.parametrize("field", ["keep_alive_timeout_s", "header_timeout_s", "body_timeout_s"])
def test_negative_timeouts_are_refused(field: str) -> None:
    with pytest.raises(ValueError, match=field.replace("_", "-")):
        HttpLimitsConfig(**{field: -1.0})


def test_a_header_count_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="max-headers"):
        HttpLimitsConfig(max_headers=0)
