"""Demo policy variants: ``NAME+kv`` runs the gateway with ``--kv-events``."""

from __future__ import annotations

import pytest

from gateway.cli import build_parser
from gateway_lab.demo import policy_variant, run


def test_policy_variant() -> None:
    assert policy_variant("cache_aware") == ("cache_aware", [])
    assert policy_variant("cache_aware+kv") == ("cache_aware", ["--kv-events"])
    with pytest.raises(ValueError, match="unknown policy variant"):
        policy_variant("cache_aware+nope")


def test_unknown_variant_is_refused_before_anything_starts() -> None:
    args = build_parser().parse_args(["demo", "--policies", "cache_aware+nope"])
    with pytest.raises(SystemExit, match="unknown policies"):
        run(args)
