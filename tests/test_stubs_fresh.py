"""The committed stubs in src/gateway/proto/ must be exactly what proto/ generates.

Editing a .proto without regenerating (or hand-editing a stub) would make the
code and the stated wire contract drift apart silently; this catches it.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
COMMITTED = ROOT / "src" / "gateway" / "proto"
GENERATOR = ROOT / "scripts" / "gen_protos.py"
HINT = "stubs are stale: run scripts/gen_protos.py and commit src/gateway/proto/"


def _stub_files(folder: Path) -> dict[str, bytes]:
    return {
        path.name: path.read_bytes()
        for path in sorted(folder.iterdir())
        if path.is_file() and path.suffix in {".py", ".pyi"}
    }


def test_committed_stubs_match_a_fresh_generation(tmp_path: Path) -> None:
    out = tmp_path / "proto"
    result = subprocess.run(
        [sys.executable, str(GENERATOR), "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, f"gen_protos.py failed:\n{result.stderr}"

    fresh = _stub_files(out)
    committed = _stub_files(COMMITTED)
    assert fresh, "gen_protos.py wrote no stubs"
    missing = sorted(set(fresh) - set(committed))
    extra = sorted(set(committed) - set(fresh))
    changed = sorted(name for name in set(fresh) & set(committed) if fresh[name] != committed[name])
    assert not (missing or extra or changed), (
        f"{HINT} (missing: {missing}, not generated any more: {extra}, differ: {changed})"
    )
