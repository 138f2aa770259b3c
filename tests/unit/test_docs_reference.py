"""The generated reference pages of the docs are what the code gives now, and the version
the CLI shows is pyproject's, the newest in the changelog."""

from __future__ import annotations

import re
import tomllib
from importlib import metadata
from pathlib import Path

import pytest

from tools.docs_reference import DOCS, PAGES_WITHOUT_DATABASE

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("page", sorted(PAGES_WITHOUT_DATABASE))
def test_each_generated_reference_page_is_what_the_code_gives_now(page: str) -> None:
    committed = (DOCS / page).read_text(encoding="utf-8")
    assert committed == PAGES_WITHOUT_DATABASE[page](), (
        f"docs/{page} differs from the code: run python -m tools.docs_reference"
    )


def test_the_configuration_page_names_every_setting() -> None:
    from adapters.settings import Settings

    page = (DOCS / "reference/configuration.md").read_text(encoding="utf-8")
    for name, info in Settings.model_fields.items():
        assert f"`BILLING_LEDGER_{name.upper()}`" in page
        assert info.description, f"{name} has no description for the reference"


def test_the_version_shown_is_pyprojects_and_the_changelogs_newest() -> None:
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert metadata.version("billing-ledger") == version
    changelog = (ROOT / "CHANGELOG.md").read_text(encoding="utf-8")
    released = re.findall(r"^## \[(\d+\.\d+\.\d+)\]", changelog, flags=re.M)
    assert released and released[0] == version


def test_billing_ledger_version_prints_pyprojects_version(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from adapters.cli.main import main

    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0
    assert capsys.readouterr().out.strip() == f"billing-ledger {version}"
