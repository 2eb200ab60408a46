"""The import rules of the house, checked on the source (ast, nothing imported):

* no import cycle between modules of ``src/gateway`` and ``src/gateway_lab`` (imports
  under ``TYPE_CHECKING`` and inside functions count: a cycle hidden that way is still a
  cycle);
* imports point downwards between layers (DESIGN.md: cli > server > endpoints >
  pipeline > sync > workers > policies > tokenization > parsers > protocol > proto);
* ``gateway`` never imports ``gateway_lab`` (the simulator, benchmarks and demo sit on
  top of the product and drive it from outside);
* ``gateway_lab.sim`` (the stand-in for a real worker) imports only ``gateway.proto``,
  itself and the config-dataclass helper ``gateway.settings``: it stays an independent
  witness that never sees the policies or the routing code;
* no ``grpc`` import above ``workers/`` (``workers/transport.py`` is the engine-neutral
  seam), except in the gRPC front door ``server/grpc`` and the server's assembly.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
PACKAGES = (SRC / "gateway", SRC / "gateway_lab")
LAB = "gateway_lab"

# Higher may import lower (or equal, within a layer), never higher.
LAYERS: dict[str, int] = {
    "__main__": 100,
    "cli": 100,
    # Tools built on the whole gateway (inspect CLI, the Python client).
    "inspect_cli": 90,
    "inspect_render": 90,
    "client": 90,
    "server.serve": 90,  # assembles the doors, the engine and the background loops
    "server": 80,  # server/http, server/grpc and what both doors share (state, config, auth, admission)
    "observability": 75,  # metrics and access log: observe the pipeline, used by the doors
    "endpoints": 70,
    "pipeline": 60,
    "sync": 55,
    "workers": 50,
    "policies": 40,
    "tokenization": 30,
    "parsers": 20,
    "protocol": 10,
    "proto": 5,
    "settings": 0,  # typed-config helper, imports nothing of the gateway
    "help_tiers": 0,  # --help / --help-all, imports nothing of the gateway
    "config_layers": 0,  # --config FILE / TOKEN_GATEWAY_* sources under settings (pydantic-settings)
    "": 0,  # the package itself (gateway/__init__.py)
}
LAB_LAYER = 101  # all of gateway_lab: above the whole product it drives (its CLI included)
SIM_MAY_IMPORT = ("gateway_lab.sim", "gateway.proto", "gateway.settings")
# Where grpc may not be imported: every layer that talks to workers only through
# ``workers/transport.py``, and the pure layers below it.
NO_GRPC = (
    "gateway.server", "gateway.observability", "gateway.endpoints", "gateway.pipeline", "gateway.sync",
    "gateway.policies", "gateway.tokenization", "gateway.parsers", "gateway.protocol",
)
# The gRPC front door, and the server's assembly (it makes the front door's TLS credentials).
GRPC_ALLOWED = ("gateway.server.grpc", "gateway.server.serve", "gateway.server.tls")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


MODULES: dict[str, Path] = {module_name(p): p for package in PACKAGES for p in package.rglob("*.py")}


def resolve(importer: str, node: ast.ImportFrom | ast.Import) -> Iterator[str]:
    """The gateway modules an import statement loads (a ``from pkg import mod`` names the module)."""
    if isinstance(node, ast.Import):
        for alias in node.names:
            if alias.name.startswith("gateway"):
                yield alias.name
        return
    if node.level:
        is_package = MODULES.get(importer, Path()).name == "__init__.py"
        base = importer.split(".")
        base = base[: len(base) - node.level + (1 if is_package else 0)]
        target = ".".join(base + ([node.module] if node.module else []))
    else:
        target = node.module or ""
    if not target.startswith("gateway"):
        return
    subs = [f"{target}.{a.name}" for a in node.names if f"{target}.{a.name}" in MODULES]
    if subs:
        yield from subs
    if len(subs) < len(node.names):
        yield target


def imports() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for name, path in MODULES.items():
        found: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                found.update(t for t in resolve(name, node) if t != name)
        graph[name] = found
    return graph


def layer(module: str) -> int:
    if module == LAB or module.startswith(LAB + "."):
        return LAB_LAYER
    rest = module.removeprefix("gateway").lstrip(".")
    while True:
        if rest in LAYERS:
            return LAYERS[rest]
        if "." not in rest:
            raise AssertionError(f"module {module} belongs to no layer: add it to LAYERS in tests/test_layers.py")
        rest = rest.rsplit(".", 1)[0]


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found: list[list[str]] = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph.get(root, ()))))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in graph:
                    continue
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    top = stack.pop()
                    on_stack.discard(top)
                    component.append(top)
                    if top == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_no_import_cycles() -> None:
    assert cycles(imports()) == []


def test_imports_point_downwards() -> None:
    upward = [
        f"{a} ({layer(a)}) imports {b} ({layer(b)})"
        for a, targets in sorted(imports().items())
        for b in sorted(targets)
        if layer(b) > layer(a)
    ]
    assert upward == []


def test_the_gateway_never_imports_the_lab() -> None:
    leaks = [
        f"{a} imports {b}"
        for a, targets in sorted(imports().items())
        if not (a == LAB or a.startswith(LAB + "."))
        for b in sorted(targets)
        if b == LAB or b.startswith(LAB + ".")
    ]
    assert leaks == []


def test_the_simulator_is_independent() -> None:
    leaks = [
        f"{a} imports {b}"
        for a, targets in sorted(imports().items())
        if a.startswith("gateway_lab.sim")
        for b in sorted(targets)
        if not b.startswith(SIM_MAY_IMPORT)
    ]
    assert leaks == []


def external_imports(path: Path) -> set[str]:
    """The top-level names of the modules ``path`` imports from outside the gateway."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            found.add(node.module.split(".")[0])
    return found


def is_grpc(top: str) -> bool:
    return top == "grpc" or top.startswith("grpc_")


def test_no_grpc_above_the_worker_seam() -> None:
    leaks = sorted(
        f"{name} imports grpc"
        for name, path in MODULES.items()
        if name.startswith(NO_GRPC) and not name.startswith(GRPC_ALLOWED)
        and any(is_grpc(top) for top in external_imports(path))
    )
    assert leaks == []


def test_the_grpc_checker_sees_every_spelling(tmp_path: Path) -> None:
    source = tmp_path / "m.py"
    source.write_text("import grpc.aio\nfrom grpc_health.v1 import health\ndef f():\n    from grpc import aio\n")
    assert {t for t in external_imports(source) if is_grpc(t)} == {"grpc", "grpc_health"}
    source.write_text("from opentelemetry.exporter.otlp.proto.grpc import x\nfrom . import grpc\n")
    assert not any(is_grpc(t) for t in external_imports(source))


def test_the_checker_sees_cycles_and_type_only_imports() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    tree = ast.parse("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from gateway_lab.sim.worker import SimWorker\n")
    found = {t for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) for t in resolve("gateway_lab.sim.servicer", n)}
    assert found == {"gateway_lab.sim.worker"}
