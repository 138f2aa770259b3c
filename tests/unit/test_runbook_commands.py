"""Every ``billing-ledger`` command the runbooks tell an operator to run is one the CLI
accepts (parsed by the real parser, not run): a renamed option fails here, not during
an incident; and every link between the pages leads to one. Their SQL is run against a
migrated database by ``tests/integration/test_runbooks.py``."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from adapters.cli.main import build_parser

RUNBOOKS = Path(__file__).resolve().parents[2] / "docs/operate/runbooks"
BLOCK = re.compile(r"```sh\n(.*?)```", re.S)
COMMAND = re.compile(r"(?:^|\* )billing-ledger (.+)")


def runbook_commands() -> list[tuple[str, str]]:
    """(page, command) for each ``billing-ledger`` line of the pages' sh blocks."""
    found = []
    for page in sorted(RUNBOOKS.glob("*.md")):
        for block in BLOCK.findall(page.read_text()):
            for line in block.replace("\\\n", " ").splitlines():
                match = COMMAND.search(line.strip())
                if match:
                    command = re.split(r" (?:\||>|#|2>&1)", match.group(1))[0]
                    found.append((page.name, command))
    return found


def test_the_runbooks_give_commands_for_every_page() -> None:
    pages = {page for page, _ in runbook_commands()}
    assert pages == {p.name for p in RUNBOOKS.glob("*.md")}


@pytest.mark.parametrize(("page", "command"), runbook_commands())
def test_each_runbook_command_is_one_the_cli_accepts(page: str, command: str) -> None:
    try:
        args = build_parser().parse_args(shlex.split(command))
    except SystemExit:
        pytest.fail(f"{page}: billing-ledger {command}: the CLI refuses it")
    assert callable(args.handler)


def test_the_runbooks_link_only_to_pages_of_their_own_directory() -> None:
    links = [
        (page.name, target)
        for page in RUNBOOKS.glob("*.md")
        for target in re.findall(r"\]\(([^)]+)\)", page.read_text())
    ]
    assert len(links) >= 20
    for page, target in links:
        assert (RUNBOOKS / target.partition("#")[0]).is_file(), f"{page}: {target}"
