"""`token-gateway bench soak` (gateway_lab.bench.scenarios.soak): its flags reach the soak's
config, and its exit status says whether every request ended cleanly and memory stayed flat
(the soak itself runs in tests/e2e/test_soak.py)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import pytest

from gateway_lab.bench.scenarios import soak as scenario
from gateway_lab.bench.soak import SoakConfig, SoakReport


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    scenario.add_arguments(parser)
    return parser.parse_args(list(argv))


def _run(monkeypatch: pytest.MonkeyPatch, report: SoakReport, *argv: str) -> tuple[int, SoakConfig]:
    seen: list[SoakConfig] = []

    async def fake_soak(cfg: SoakConfig, tmp: Path) -> SoakReport:
        seen.append(cfg)
        return report

    monkeypatch.setattr(scenario, "run_soak", fake_soak)
    status = scenario.main(_args(*argv))
    return status, seen[0]


def _report(**kw: Any) -> SoakReport:
    base: dict[str, Any] = dict(config={}, seconds=2.0, completed=100, outcomes={"ok": 100}, by_kind={"chat": {"ok": 100}},
                                rss_mb=[100.0, 100.5, 100.2, 100.4, 100.1, 100.3])
    return SoakReport(**{**base, **kw})


def test_flags_reach_the_config_and_a_clean_flat_run_passes(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    out = tmp_path / "soak.json"
    status, cfg = _run(monkeypatch, _report(), "--requests", "123", "--workers", "5", "--gateway-process", "--json", str(out))
    assert status == 0
    assert (cfg.requests, cfg.workers, cfg.gateway_process) == (123, 5, True)
    written = json.loads(out.read_text())
    assert written["completed"] == 100 and written["all_clean"] is True


@pytest.mark.parametrize("bad", [
    {"outcomes": {"ok": 99, "unclean": 1}},
    {"leftover": {"in_flight": 2}},
    {"rss_mb": [100.0, 100.0, 140.0, 160.0, 170.0, 180.0]},
])  # fmt: skip
def test_an_unclean_request_a_leftover_counter_or_memory_growth_fails(monkeypatch: pytest.MonkeyPatch, bad: dict[str, Any]) -> None:
    status, _ = _run(monkeypatch, _report(**bad), "--max-growth-mb", "24")
    assert status == 1
