"""The test rule, checked on the tree: every module with logic has a unit test file that
mirrors it (``src/gateway/<package>/<module>.py`` -> ``tests/<package>/test_<module>.py``;
``src/gateway_lab/...`` -> ``tests/lab/...``). Whole-stack tests live under ``tests/e2e/``
by topic and do not count as a module's mirror.

Every module with logic has its mirror, with no exceptions: a new module comes with its
test file.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src"
TESTS = ROOT / "tests"
PACKAGES = {"gateway": TESTS, "gateway_lab": TESTS / "lab"}
NOT_MODULES = {"__init__.py", "__main__.py"}
GENERATED = SRC / "gateway" / "proto"



def has_logic(path: Path) -> bool:
    """A module with a function or a class of its own (re-export and constant modules have none)."""
    tree = ast.parse(path.read_text(), str(path))
    return any(isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) for n in tree.body)


def mirror(path: Path) -> Path:
    """Where a module's unit tests live."""
    rel = path.relative_to(SRC)
    return PACKAGES[rel.parts[0]].joinpath(*rel.parts[1:-1], "test_" + rel.name)


def modules_with_logic() -> dict[str, Path]:
    found: dict[str, Path] = {}
    for package in PACKAGES:
        for path in sorted((SRC / package).rglob("*.py")):
            if path.name in NOT_MODULES or path.is_relative_to(GENERATED) or not has_logic(path):
                continue
            found[path.relative_to(SRC).as_posix()] = path
    return found


def unmirrored() -> set[str]:
    return {name for name, path in modules_with_logic().items() if not mirror(path).exists()}


def test_every_module_with_logic_has_its_mirror_test_file() -> None:
    missing = sorted(unmirrored())
    assert missing == [], "add tests/<package>/test_<module>.py for: " + ", ".join(missing)


def test_the_rule_reads_the_tree() -> None:
    """Guards against a rule that passes by finding nothing."""
    found = modules_with_logic()
    assert "gateway/pipeline/engine.py" in found and "gateway_lab/bench/soak.py" in found
    assert "gateway/proto/gateway_pb2.py" not in found


def test_the_mirror_of_a_module() -> None:
    assert mirror(SRC / "gateway" / "pipeline" / "engine.py") == TESTS / "pipeline" / "test_engine.py"
    assert mirror(SRC / "gateway" / "cli.py") == TESTS / "test_cli.py"
    assert mirror(SRC / "gateway_lab" / "sim" / "radix_cache.py") == TESTS / "lab" / "sim" / "test_radix_cache.py"
