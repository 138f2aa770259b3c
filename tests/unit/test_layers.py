"""The layers' arrows point down: ``tools -> adapters -> projections -> store -> domain``.

Each layer imports only the layers below it (and itself); ``infra`` (embedded services,
the Stripe emulator) and ``tools`` (demo, benchmarks) are imported by no service
module, except the CLI's lazy doors to the tools (the commands ``demo``, ``bench`` and
``up``); and
the packages of ``adapters`` do not import each other in a circle.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LAYERS = ("domain", "store", "projections", "adapters", "tools")
ALLOWED: dict[str, frozenset[str]] = {
    "domain": frozenset({"domain"}),
    "store": frozenset({"store", "domain"}),
    "projections": frozenset({"projections", "store", "domain"}),
    "adapters": frozenset({"adapters", "projections", "store", "domain"}),
    "tools": frozenset({"tools", "adapters", "projections", "store", "domain", "infra"}),
    "infra": frozenset({"infra"}),
}
PROJECT = frozenset(ALLOWED)
TOOLS_DOORS = frozenset({"adapters/cli/tools.py", "adapters/cli/service.py"})


def project_imports(path: Path) -> Iterator[tuple[int, str]]:
    """(line, module) of every import of a project module in ``path``, including
    imports inside functions and ``importlib.import_module("...")`` with a literal."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        elif isinstance(node, ast.Call) and _dynamic(node):
            arg = node.args[0] if node.args else None
            if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                names = [arg.value]
            elif isinstance(arg, ast.JoinedStr) and arg.values:
                head = arg.values[0]
                if isinstance(head, ast.Constant) and isinstance(head.value, str):
                    names = [head.value]
        for name in names:
            if name.partition(".")[0] in PROJECT:
                yield node.lineno, name


def _dynamic(node: ast.Call) -> bool:
    func = node.func
    if isinstance(func, ast.Name):
        return func.id in {"__import__", "import_module"}
    return isinstance(func, ast.Attribute) and func.attr == "import_module"


def _modules(layer: str) -> list[Path]:
    return sorted((ROOT / layer).rglob("*.py"))


MODULES = [p for layer in (*LAYERS, "infra") for p in _modules(layer)]


def violations(path: Path) -> list[str]:
    rel = path.relative_to(ROOT).as_posix()
    layer = rel.partition("/")[0]
    found = []
    for line, name in project_imports(path):
        target = name.partition(".")[0]
        if target == "tools" and rel in TOOLS_DOORS:
            continue  # the CLI's lazy door to the demo and the benchmarks
        if target not in ALLOWED[layer]:
            found.append(f"{rel}:{line}: {layer} imports {name}")
    return found


def test_the_check_sees_every_layer() -> None:
    seen = {p.relative_to(ROOT).parts[0] for p in MODULES}
    assert seen == {*LAYERS, "infra"}


@pytest.mark.parametrize("path", MODULES, ids=[p.relative_to(ROOT).as_posix() for p in MODULES])
def test_no_module_imports_a_layer_above_its_own(path: Path) -> None:
    problems = violations(path)
    assert not problems, "an arrow points up:\n" + "\n".join(problems)


def test_the_check_names_an_upward_import(tmp_path: Path) -> None:
    fake = ROOT / "store" / "_probe_upward.py"
    try:
        fake.write_text("def f():\n    from adapters.settings import Settings\n")
        assert violations(fake) == ["store/_probe_upward.py:2: store imports adapters.settings"]
        fake.write_text("import importlib\nimportlib.import_module('tools.demo')\n")
        assert violations(fake) == ["store/_probe_upward.py:2: store imports tools.demo"]
    finally:
        fake.unlink()


def _package_of(module: str) -> str:
    """``adapters.charging.relay`` -> ``adapters.charging``; ``adapters.bootstrap`` -> itself."""
    parts = module.split(".")
    if parts[0] != "adapters" or len(parts) < 2:
        return parts[0]
    return ".".join(parts[:2])


def package_graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for path in _modules("adapters"):
        rel = path.relative_to(ROOT).with_suffix("")
        source = _package_of(".".join(p for p in rel.parts if p != "__init__"))
        for _, name in project_imports(path):
            target = _package_of(name)
            if target.startswith("adapters") and target != source:
                graph.setdefault(source, set()).add(target)
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """A circle of packages in ``graph`` (first found), or None."""
    done: set[str] = set()

    def visit(node: str, path: list[str]) -> list[str] | None:
        if node in path:
            return [*path[path.index(node) :], node]
        if node in done:
            return None
        for nxt in sorted(graph.get(node, ())):
            cycle = visit(nxt, [*path, node])
            if cycle:
                return cycle
        done.add(node)
        return None

    for start in sorted(graph):
        cycle = visit(start, [])
        if cycle:
            return cycle
    return None


def test_the_packages_of_adapters_import_each_other_in_no_circle() -> None:
    cycle = find_cycle(package_graph())
    assert cycle is None, "a circle of imports: " + " -> ".join(cycle or [])


def test_the_cycle_check_finds_a_circle() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": {"c"}}) is None
