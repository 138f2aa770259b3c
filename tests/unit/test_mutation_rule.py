"""The rule that leaves observability out of ``make mutate`` (tests/README.md): a helper
of the money path whose name says it only logs, counts or traces (``_log_*``,
``_count_*``, ``_trace_*``) carries ``# pragma: no mutate block``, and nothing else does,
so the mark cannot hide a rule about money."""

from __future__ import annotations

import ast
import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
OBSERVING = re.compile(r"_(log|count|trace)_\w+")
PRAGMA = "# pragma: no mutate block"


def _files() -> list[Path]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mutmut"]
    found: list[Path] = []
    for source in config["source_paths"]:
        path = ROOT / source
        found += sorted(path.rglob("*.py")) if path.is_dir() else [path]
    return found


def _marked(path: Path) -> dict[str, bool]:
    """Each function of ``path``: whether its signature ends with the pragma."""
    lines = path.read_text().splitlines()
    marks = {}
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            header = lines[node.lineno - 1 : node.body[0].lineno - 1]
            signature_end = next(
                (line for line in header if line.rstrip().split("#")[0].rstrip().endswith(":")),
                "",
            )
            marks[node.name] = PRAGMA in signature_end
    return marks


def test_the_money_path_is_mutated() -> None:
    names = {p.relative_to(ROOT).as_posix() for p in _files()}
    assert {"adapters/charging/pusher.py", "adapters/stripe/client.py"} <= names
    assert "adapters/webhooks/handler.py" in names and "domain/money.py" in names


def test_observing_helpers_and_only_they_are_left_unmutated() -> None:
    wrong = []
    for path in _files():
        for name, marked in _marked(path).items():
            if marked != bool(OBSERVING.fullmatch(name)):
                wrong.append(f"{path.relative_to(ROOT)}: {name} {'marked' if marked else 'not'}")
    assert wrong == []


def test_the_rule_sees_a_mark_and_a_missing_one(tmp_path: Path) -> None:
    probe = tmp_path / "probe.py"
    probe.write_text(
        "def _count_x(a: int) -> None:  # pragma: no mutate block\n    pass\n\n\n"
        "def _log_y(\n    a: int,\n) -> None:\n    pass\n\n\n"
        "def money() -> int:  # pragma: no mutate block\n    return 1\n"
    )
    assert _marked(probe) == {"_count_x": True, "_log_y": False, "money": True}
