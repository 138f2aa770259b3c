"""Help that teaches (``adapters.cli.help``): every command's help ends with examples of
itself and the variables it reads, every option says what it is for, and the shell
completion script knows every command."""

from __future__ import annotations

import argparse
from collections.abc import Iterator

import pytest

from adapters.cli.main import build_parser, main


def _commands(
    parser: argparse.ArgumentParser, path: str = ""
) -> Iterator[tuple[str, argparse.ArgumentParser]]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                here = f"{path} {name}".strip()
                yield here, sub
                yield from _commands(sub, here)


COMMANDS = list(_commands(build_parser()))


def test_the_tree_has_the_commands_a_user_reaches_for() -> None:
    paths = {path for path, _ in COMMANDS}
    assert {"demo", "produce", "run", "health", "dead-letters redrive", "audit"} <= paths
    assert {"invoices settle", "accounts set-limit", "completion"} <= paths


@pytest.mark.parametrize(("path", "parser"), COMMANDS, ids=[p for p, _ in COMMANDS])
def test_each_command_ends_with_examples_of_itself_and_the_variables_it_reads(
    path: str, parser: argparse.ArgumentParser
) -> None:
    text = parser.format_help()
    examples = text[text.index("examples:") :]
    first = examples.splitlines()[1].strip()
    assert first.startswith(f"billing-ledger {path}"), first
    assert "\nreads: " in examples


@pytest.mark.parametrize(("path", "parser"), COMMANDS, ids=[p for p, _ in COMMANDS])
def test_every_option_says_what_it_is_for(path: str, parser: argparse.ArgumentParser) -> None:
    silent = [
        a.dest
        for a in parser._actions
        if not a.help and not isinstance(a, argparse._SubParsersAction)
    ]
    assert silent == [], path


def test_the_completion_script_offers_every_top_level_command(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["completion", "bash"]) == 0
    script = capsys.readouterr().out
    for path, _ in COMMANDS:
        if " " not in path:
            assert path in script, path


def test_the_top_level_help_says_the_exit_statuses() -> None:
    assert "Exit status: 0 done, 1 a check failed, 2 misuse, 3 a service unreachable" in (
        build_parser().format_help().replace("\n", " ").replace("  ", " ")
    )


def test_rebuild_names_every_projection() -> None:
    from adapters.cli.ledger import PROJECTION_NAMES
    from projections.projector import PROJECTIONS

    assert tuple(p.name for p in PROJECTIONS) == PROJECTION_NAMES
