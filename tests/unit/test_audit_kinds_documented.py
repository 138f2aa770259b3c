"""Every kind of finding the audit can emit is in the audit-finding runbook's table of
kinds (a kind added without telling the operator what it means fails here), and the
table names no kind the audit never emits."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RUNBOOK = ROOT / "docs/operate/runbooks/audit-finding.md"
# ``domain.audit.check_transactions`` picks one of these two for a transaction's problem.
COMPUTED = {"double_charge", "sequence"}


def emitted_kinds() -> set[str]:
    """The first argument of every ``Finding(...)`` in the audit's code that is a literal,
    and the kinds chosen at run time (``COMPUTED``)."""
    kinds: set[str] = set()
    computed: set[str] = set()
    for path in [*(ROOT / "domain").rglob("*.py"), *(ROOT / "adapters").rglob("*.py")]:
        for node in _original(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "Finding":
                first = node.args[0]
                if isinstance(first, ast.Constant):
                    kinds.add(first.value)
                else:
                    computed.add(ast.unparse(node))
    assert computed == {"Finding(kind, txn.transaction_id, problem)"}, (
        "a new computed kind: add its values to COMPUTED"
    )
    return kinds | COMPUTED


def _original(tree: ast.AST) -> Iterator[ast.AST]:
    """Every node of ``tree`` but those of mutmut's mutants (``make mutate`` runs this
    test on copies holding each function's mutants beside its original)."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.FunctionDef) and _MUTANT.search(node.name):
            continue
        yield node
        yield from _original(node)


_MUTANT = re.compile(r"__mutmut_\d+$")


def documented_kinds() -> set[str]:
    """The kinds in the first column of the runbook's table ``| kind | ... |``."""
    text = RUNBOOK.read_text()
    table = text[text.index("| kind |") :].split("\n\n")[0]
    rows = [line.split("|")[1] for line in table.splitlines()[2:]]
    return {kind for row in rows for kind in re.findall(r"`([a-z_]+)`", row)}


def test_every_kind_the_audit_emits_is_in_the_runbook_and_no_other() -> None:
    emitted = emitted_kinds()
    assert {"credits", "purchase", "purchase_webhook", "projection"} <= emitted
    assert documented_kinds() == emitted
