"""Every SQL statement the runbooks (``docs/operate/runbooks/``) give an operator runs
against the migrated schema: a renamed column or view fails here, not during an
incident. (Their ``billing-ledger`` commands: ``tests/unit/test_runbook_commands.py``.)"""

from __future__ import annotations

import re
from pathlib import Path

import psycopg
import pytest

from adapters.bootstrap import migrate
from adapters.settings import Settings

pytestmark = pytest.mark.integration

RUNBOOKS = Path(__file__).resolve().parents[2] / "docs/operate/runbooks"
BLOCK = re.compile(r"```sql\n(.*?)```", re.S)


def runbook_statements() -> list[tuple[str, str]]:
    """(page, statement) for each statement of the pages' sql blocks."""
    found = []
    for page in sorted(RUNBOOKS.glob("*.md")):
        for block in BLOCK.findall(page.read_text()):
            code = "\n".join(re.sub(r"^\s+", "", line) for line in block.splitlines())
            found += [(page.name, s.strip()) for s in code.split(";") if _code(s)]
    return found


def _code(statement: str) -> bool:
    return any(line and not line.startswith("--") for line in statement.strip().splitlines())


def test_every_runbook_statement_runs_on_the_migrated_schema(settings: Settings) -> None:
    statements = runbook_statements()
    assert len(statements) >= 15
    migrate(settings)
    with psycopg.connect(settings.database_url) as conn:
        for page, statement in statements:
            try:
                with conn.transaction(), conn.cursor() as cur:
                    cur.execute(statement)
                    cur.fetchall()
            except psycopg.Error as exc:
                pytest.fail(f"{page}: {statement}\n{exc}")
