"""The migration runner's logic without a database: this build's files, how a schema
stands against them, the messages a person acts on, the retry pauses, and a worker's
wait for ``migrate``."""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from pathlib import Path

import pytest

from store.errors import MigrationChanged, MigrationsInvalid, SchemaAhead, SchemaNotReady
from store.migrations.runner import retry_delays
from store.migrations.status import (
    AppliedMigration,
    Migration,
    SchemaState,
    SchemaStatus,
    load_migrations,
    migrations,
    wait_until_current,
)
from store.schema import EVENTS_TABLE

ONE = Migration(1, "initial", "CREATE TABLE a (x int);\n")
TWO = Migration(2, "add_b", "CREATE TABLE b (x int);\n")
AT = datetime(2026, 12, 3, tzinfo=UTC)


def applied(m: Migration, checksum: str | None = None) -> AppliedMigration:
    return AppliedMigration(m.number, m.name, checksum or m.checksum, AT, 0.01)


def test_this_builds_migrations_are_numbered_from_one_and_the_first_is_the_initial_schema() -> None:
    found = migrations()
    assert [m.number for m in found] == list(range(1, len(found) + 1))
    assert found[0].name == "initial"
    assert EVENTS_TABLE in found[0].sql
    assert all(len(m.checksum) == 64 for m in found)


def test_files_are_loaded_in_number_order_and_other_files_are_ignored(tmp_path: Path) -> None:
    (tmp_path / "0002_add_b.sql").write_text(TWO.sql)
    (tmp_path / "0001_initial.sql").write_text(ONE.sql)
    (tmp_path / "README.txt").write_text("not a migration")
    assert load_migrations(tmp_path) == (ONE, TWO)


@pytest.mark.parametrize(
    ("names", "message"),
    [
        (["0001_a.sql", "0003_c.sql"], r"numbered 1\.\.N without gaps, found \[1, 3\]"),
        (["0002_b.sql"], r"without gaps, found \[2\]"),
        (["0001_a.sql", "1_b.sql"], "is not named NNNN_name.sql"),
        (["0001_Add-B.sql"], "is not named NNNN_name.sql"),
    ],
)
def test_misnumbered_or_misnamed_files_are_refused(
    tmp_path: Path, names: list[str], message: str
) -> None:
    for name in names:
        (tmp_path / name).write_text("SELECT 1;")
    with pytest.raises(MigrationsInvalid, match=message):
        load_migrations(tmp_path)


def test_the_checksum_changes_with_the_sql_but_not_with_line_endings() -> None:
    assert Migration(1, "a", "SELECT 1;\r\nSELECT 2;\r\n").checksum == (
        Migration(1, "a", "SELECT 1;\nSELECT 2;\n").checksum
    )
    assert Migration(1, "a", "SELECT 1;").checksum != Migration(1, "a", "SELECT 2;").checksum


def test_an_empty_database_is_behind_and_is_told_to_run_migrate() -> None:
    status = SchemaStatus((ONE, TWO), ())
    assert (status.state, status.version, status.latest) == (SchemaState.BEHIND, 0, 2)
    assert status.pending == (ONE, TWO)
    assert status.problem() == "schema at 0, this build needs 2: run billing-ledger migrate"


def test_a_database_with_every_migration_as_written_is_current() -> None:
    status = SchemaStatus((ONE, TWO), (applied(ONE), applied(TWO)))
    assert (status.state, status.version, status.pending) == (SchemaState.CURRENT, 2, ())
    assert status.problem() == ""


def test_a_database_one_migration_behind_names_both_versions() -> None:
    status = SchemaStatus((ONE, TWO), (applied(ONE),))
    assert status.state is SchemaState.BEHIND
    assert status.pending == (TWO,)
    assert status.problem().startswith("schema at 1, this build needs 2")


def test_an_applied_migration_whose_file_changed_is_named_with_both_checksums() -> None:
    status = SchemaStatus((ONE, TWO), (applied(ONE, checksum="f" * 64),))
    assert status.state is SchemaState.CHANGED
    problem = status.problem()
    assert "migration 1 initial was applied with checksum ffffffffffff" in problem
    assert ONE.checksum[:12] in problem
    assert "must not be edited" in problem


def test_a_database_that_a_newer_build_migrated_is_ahead() -> None:
    status = SchemaStatus((ONE,), (applied(ONE), applied(TWO)))
    assert (status.state, status.version, status.latest) == (SchemaState.AHEAD, 2, 1)
    assert status.unknown == (applied(TWO),)
    assert "schema is at 2, newer than this build" in status.problem()
    assert "2 add_b" in status.problem()


def test_retry_pauses_are_jittered_under_a_doubling_ceiling() -> None:
    assert retry_delays(5, base_s=0.5, max_s=3.0, rand=lambda: 1.0) == [0.5, 1.0, 2.0, 3.0]
    assert retry_delays(5, rand=lambda: 0.0) == [0.0] * 4
    assert retry_delays(1) == []


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def wait(self, seconds: float) -> None:
        self.now += seconds


def test_a_worker_waits_saying_what_to_run_until_the_schema_is_current(
    caplog: pytest.LogCaptureFixture,
) -> None:
    answers = [SchemaStatus((ONE, TWO), ()), SchemaStatus((ONE, TWO), (applied(ONE),))]
    answers.append(SchemaStatus((ONE, TWO), (applied(ONE), applied(TWO))))
    clock = _Clock()
    with caplog.at_level(logging.WARNING, logger="store.migrations"):
        status = wait_until_current(
            lambda: answers.pop(0), timeout_s=60, interval_s=5, wait=clock.wait, clock=clock
        )
    assert status.state is SchemaState.CURRENT
    assert clock.now == 10  # two waits, then current
    assert [r.getMessage() for r in caplog.records] == [
        "schema at 0, this build needs 2: run billing-ledger migrate",
        "schema at 1, this build needs 2: run billing-ledger migrate",
    ]


def test_a_worker_gives_up_after_its_timeout_with_what_to_run() -> None:
    clock = _Clock()
    with pytest.raises(
        SchemaNotReady, match=r"schema at 0, this build needs 1: run billing-ledger"
    ):
        wait_until_current(
            lambda: SchemaStatus((ONE,), ()), timeout_s=30, interval_s=5, wait=clock.wait,
            clock=clock,
        )  # fmt: skip
    assert clock.now == 30


@pytest.mark.parametrize(
    ("status", "error"),
    [
        (SchemaStatus((ONE,), (applied(ONE), applied(TWO))), SchemaAhead),
        (SchemaStatus((ONE,), (applied(ONE, checksum="0" * 64),)), MigrationChanged),
    ],
)
def test_a_worker_refuses_at_once_a_schema_that_waiting_cannot_fix(
    status: SchemaStatus, error: type[Exception]
) -> None:
    clock = _Clock()
    with pytest.raises(error):
        wait_until_current(
            lambda: status, timeout_s=600, interval_s=5, wait=clock.wait, clock=clock
        )
    assert clock.now == 0
