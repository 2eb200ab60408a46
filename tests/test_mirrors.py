"""The test rule, checked on the tree: every module with logic has a unit test file that
mirrors it (``src/gateway/<package>/<module>.py`` -> ``tests/<package>/test_<module>.py``;
``src/gateway_lab/...`` -> ``tests/lab/...``). Whole-stack tests live under ``tests/e2e/``
by topic and do not count as a module's mirror.

Modules that had no mirror when the rule was written are listed in ``UNMIRRORED``. The
list can only shrink: a new module needs its test file, and a module that gets one (or
goes away) must leave the list.
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

UNMIRRORED = frozenset({
})


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


def test_every_new_module_with_logic_has_its_mirror_test_file() -> None:
    missing = sorted(unmirrored() - UNMIRRORED)
    assert missing == [], "add tests/<package>/test_<module>.py for: " + ", ".join(missing)


def test_the_allow_list_only_shrinks() -> None:
    stale = sorted(UNMIRRORED - unmirrored())
    assert stale == [], "these now have a mirror (or are gone): remove them from UNMIRRORED: " + ", ".join(stale)


def test_the_mirror_of_a_module() -> None:
    assert mirror(SRC / "gateway" / "pipeline" / "engine.py") == TESTS / "pipeline" / "test_engine.py"
    assert mirror(SRC / "gateway" / "cli.py") == TESTS / "test_cli.py"
    assert mirror(SRC / "gateway_lab" / "sim" / "radix_cache.py") == TESTS / "lab" / "sim" / "test_radix_cache.py"
