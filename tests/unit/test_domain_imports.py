"""The domain stays pure: no module in ``domain/`` imports I/O, adapters or settings.

STYLE.md: "Enforce the domain's import rule with a check, not a hope."
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

DOMAIN = Path(__file__).resolve().parents[2] / "domain"

FORBIDDEN = frozenset(
    {
        "psycopg",
        "psycopg_pool",
        "kafka",
        "stripe",
        "opentelemetry",
        "adapters",
        "projections",
        "infra",
        "os",
        "socket",
        "subprocess",
        "requests",
        "httpx",
    }
)


def _forbidden_module(name: str) -> str | None:
    """``name`` itself if it or a package it lives in is forbidden (``os.path`` -> os)."""
    return name if name.partition(".")[0] in FORBIDDEN else None


def violations(source: str, filename: str) -> list[str]:
    """Every forbidden import in ``source``, as ``"file:line: what"``."""
    found: list[str] = []
    for node in ast.walk(ast.parse(source, filename=filename)):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        elif isinstance(node, ast.Call) and _is_dynamic_import(node.func):
            names = [a.value for a in node.args[:1] if isinstance(a, ast.Constant)]
            names = [n for n in names if isinstance(n, str)]
        elif (
            isinstance(node, ast.Attribute)
            and node.attr == "environ"
            and isinstance(node.value, ast.Name)
            and node.value.id == "os"
        ):
            found.append(f"{filename}:{node.lineno}: references os.environ")
        for name in names:
            if _forbidden_module(name):
                found.append(f"{filename}:{node.lineno}: imports {name}")
    return found


def _is_dynamic_import(func: ast.expr) -> bool:
    if isinstance(func, ast.Name):
        return func.id in {"__import__", "import_module"}
    return isinstance(func, ast.Attribute) and func.attr == "import_module"


DOMAIN_FILES = sorted(DOMAIN.rglob("*.py"))


def test_the_check_finds_the_domain_modules() -> None:
    names = {p.name for p in DOMAIN_FILES}
    assert {"money.py", "pricing.py", "usage.py", "transaction.py", "metering.py"} <= names


@pytest.mark.parametrize("path", DOMAIN_FILES, ids=[p.name for p in DOMAIN_FILES])
def test_domain_module_imports_nothing_that_does_io(path: Path) -> None:
    problems = violations(path.read_text(encoding="utf-8"), str(path.relative_to(DOMAIN.parent)))
    assert not problems, "the domain must stay pure:\n" + "\n".join(problems)


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("import psycopg\n", "x.py:1: imports psycopg"),
        ("import json\nimport os.path\n", "x.py:2: imports os.path"),
        ("from kafka import KafkaConsumer\n", "x.py:1: imports kafka"),
        ("from opentelemetry.trace import get_tracer\n", "x.py:1: imports opentelemetry.trace"),
        ("from adapters.settings import Settings\n", "x.py:1: imports adapters.settings"),
        ("def f():\n    import stripe\n", "x.py:2: imports stripe"),
        ("import importlib\nimportlib.import_module('httpx')\n", "x.py:2: imports httpx"),
        ("x = __import__('socket')\n", "x.py:1: imports socket"),
        ("import os\nos.environ['X']\n", "x.py:2: references os.environ"),
    ],
)
def test_the_check_names_the_file_and_the_forbidden_import(source: str, expected: str) -> None:
    assert expected in violations(source, "x.py")


@pytest.mark.parametrize(
    "source",
    [
        "import json\nfrom decimal import Decimal\n",
        "from eventsourcing.domain import Aggregate\n",
        "from pydantic import BaseModel\n",
        "from domain.money import to_minor_units\n",
        "from . import money\n",
        "import osmosis\n",  # a name that merely starts with a forbidden one
    ],
)
def test_the_check_allows_the_standard_library_eventsourcing_pydantic_and_domain(
    source: str,
) -> None:
    assert violations(source, "x.py") == []
