"""The SQL reference page is what the catalog of a freshly migrated database gives now."""

from __future__ import annotations

import pytest

from adapters.bootstrap import migrate
from adapters.settings import Settings
from tools.docs_reference import DOCS, SQL_PAGE, render_sql

pytestmark = pytest.mark.integration


def test_the_sql_reference_page_is_what_a_migrated_database_holds(settings: Settings) -> None:
    migrate(settings)
    committed = (DOCS / SQL_PAGE).read_text(encoding="utf-8")
    assert committed == render_sql(settings.database_url), (
        f"docs/{SQL_PAGE} differs from the schema: run python -m tools.docs_reference"
    )
