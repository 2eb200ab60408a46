"""`token-gateway bench agent-turns`: a tiny real run on both fleet builds. One
conversation at a time, so routing has no timing to race: both modes must send the same
prompts and hit exactly as often (the reply ids Responses stores are what chat's reply
reuse recovers), at the transcript's ideal."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

COMMAND = [sys.executable, "-m", "gateway", "bench", "agent-turns"]


def test_tiny_run_hits_alike_through_both_apis(tmp_path: Path) -> None:
    out = tmp_path / "turns.json"
    done = subprocess.run(
        [*COMMAND, "--conversations", "2", "--turns", "3", "--instructions-tokens", "100", "--task-tokens", "40",
         "--user-tokens", "20", "--reply-tokens", "24", "--concurrency", "1", "--json", str(out)],
        capture_output=True, text=True, timeout=300, check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    cells = {(c["fleet"], c["mode"]): c for c in json.loads(out.read_text())["cells"]}
    assert set(cells) == {(f, m) for f in ("sim", "sglang-http") for m in ("chat", "responses")}
    for fleet in ("sim", "sglang-http"):
        chat, resp = cells[(fleet, "chat")], cells[(fleet, "responses")]
        assert chat["requests"] == resp["requests"] == 6
        assert chat["prompt_tokens"] == resp["prompt_tokens"] and chat["cached_tokens"] == resp["cached_tokens"] > 0
        assert resp["hit"] == chat["hit"] and abs(resp["hit"] - resp["ideal"]) < 0.02
    assert [(r["fleet"], r["mode"]) for r in json.loads(out.read_text())["rows"]][:2] == [("sim", "chat"), ("sim", "responses")]
