"""inspect_render: the live routing-quality table of ``inspect --gateway``."""

from __future__ import annotations

from rich.console import Console

from gateway.inspect_render import _quality, _workers


def text(q: dict[str, object]) -> str:
    console = Console(record=True, width=200)
    console.print(_quality(q))
    return console.export_text()


def test_the_quality_table_shows_the_decode_fill_when_the_policy_has_one() -> None:
    base: dict[str, object] = {"offered_prompts": 3, "ideal_hit_rate": 0.5, "achieved_hit_rate": 0.4,
                               "predicted_hit_rate": 0.4, "finished": 3}
    assert "decode fill" not in text(base)
    shown = text({**base, "decode_fill": 0.125})
    assert "decode fill" in shown and "0.125 x running requests' max_tokens" in shown


def test_worker_addresses_are_never_cut_at_80_columns() -> None:
    ids = ["127.0.0.1:41234", "127.0.0.1:41235"]
    answer = {"workers": [{"worker_id": w, "available": True, "page_size": 16, "predicted_cached_tokens": 123456,
                           "raw_match_tokens": 123456, "tree_tokens": 1234567, "tree_budget": 2345678} for w in ids],
              "decision": {"choice": ids[0], "workers": {}}}
    console = Console(record=True, width=80)
    console.print(_workers(answer))
    shown = console.export_text()
    assert all(w in shown for w in ids), shown


def test_the_quality_table_shows_misses_by_cause_largest_first() -> None:
    base: dict[str, object] = {"offered_prompts": 3, "ideal_hit_rate": 0.5, "achieved_hit_rate": 0.4,
                               "predicted_hit_rate": 0.4, "finished": 3}
    assert "misses by cause" not in text(base)
    causes = {"first_sight": {"requests": 3, "tokens": 300}, "evicted": {"requests": 1, "tokens": 100},
              "in_prefill": {"requests": 0, "tokens": 0}, "_requests": 4, "_missed_requests": 4}
    shown = text({**base, "miss_causes": causes})
    assert "misses by cause" in shown and "in_prefill" not in shown
    assert shown.index("first_sight 300 tokens (75%, 3 requests)") < shown.index("evicted 100 tokens (25%, 1 requests)")
