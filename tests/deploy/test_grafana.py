"""The Grafana dashboard queries only series a live gateway exports."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from tests.e2e.http.conftest import StackOptions, start_stack

DASHBOARD = Path(__file__).resolve().parents[2] / "deploy" / "grafana" / "token-gateway.json"
SUFFIXES = {"counter": ("_total", "_created"), "histogram": ("_bucket", "_count", "_sum", "_created"),
            "gauge": ("",), "summary": ("_count", "_sum", "")}


def _exprs(dashboard: dict[str, Any]) -> list[str]:
    out = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    out += [v["definition"] for v in dashboard["templating"]["list"] if "definition" in v]
    return out


def test_dashboard_is_well_formed() -> None:
    dash = json.loads(DASHBOARD.read_text())
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))
    exprs = _exprs(dash)
    assert len(exprs) >= 20
    for e in exprs:
        assert e.count("(") == e.count(")") and e.count("{") == e.count("}"), e
    titles = " ".join(p["title"] for p in dash["panels"])
    for wanted in ("Time to first token", "Time per output token", "Inter-token latency", "End-to-end"):
        assert wanted in titles


async def test_every_metric_in_the_dashboard_exists(tmp_path: Path) -> None:
    dash = json.loads(DASHBOARD.read_text())
    used = {name for e in _exprs(dash) for name in re.findall(r"\btoken_gateway_[a-z0-9_]+", e)}
    async with start_stack(StackOptions(), tmp_path) as stack:
        stream = await stack.client.completions.create(model=stack.model, prompt="hi", max_tokens=4, stream=True)
        async for _ in stream:
            pass
        text = (await stack.http.get("/metrics")).text
    exported: set[str] = set()
    for family in text_string_to_metric_families(text):
        exported |= {family.name + s for s in SUFFIXES.get(family.type, ("",))}
        exported |= {s.name for s in family.samples}
    missing = sorted(used - exported)
    assert not missing, f"dashboard queries series the gateway does not export: {missing}"
