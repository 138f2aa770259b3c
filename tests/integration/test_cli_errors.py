"""Every error a person can meet at the command line is one sentence that says what to
do, with the exit status of its kind (``adapters.cli.errors``: 2 misuse, 1 a failed
check, 3 a service unreachable): run as a subprocess against real services, reading
stderr as a person would. No traceback and no exception class name, unless --debug."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from uuid import uuid4

import psycopg
import pytest

from adapters.bootstrap import migrate
from adapters.settings import Settings
from infra.embedded import EmbeddedPostgres
from store.roles import READER
from tests.conftest import settings_env
from tests.integration.roles import as_role

pytestmark = pytest.mark.integration

CLI = [sys.executable, "-m", "adapters.cli"]
CLASS_NAME = re.compile(r"\b[A-Z][A-Za-z]+(Error|Exception|Privilege|Unreachable)\b")


def _cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CLI, *args], capture_output=True, text=True, env=env, timeout=120, check=False
    )


def _one_sentence(proc: subprocess.CompletedProcess[str]) -> str:
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    assert CLASS_NAME.search(lines[0]) is None, lines[0]
    assert lines[0].startswith("billing-ledger")
    return lines[0]


def test_reversing_an_id_that_names_nothing_is_misuse_naming_the_id(settings: Settings) -> None:
    migrate(settings)
    txn = uuid4()
    proc = _cli("reverse", str(txn), "--reason", "refund", env=settings_env(settings))
    assert proc.returncode == 2
    said = _one_sentence(proc)
    assert f"nothing in the ledger has the id {txn}" in said
    assert "billing-ledger transactions" in said


def test_a_command_the_login_may_not_run_says_which_login_to_use(
    roles_settings: Settings, server: str
) -> None:
    migrate(roles_settings)
    env = settings_env(roles_settings)
    env["BILLING_LEDGER_DATABASE_URL"] = as_role(server, READER)
    proc = _cli("audit", env=env)
    assert proc.returncode == 2
    said = _one_sentence(proc)
    assert "this login may not do that (permission denied" in said
    assert "billing_auditor" in said and "BILLING_LEDGER_DATABASE_URL" in said


def test_a_negative_spend_limit_is_misuse(settings: Settings) -> None:
    migrate(settings)
    proc = _cli("accounts", "set-limit", "newco", "-5", "USD", env=settings_env(settings))
    assert proc.returncode == 2
    assert "not a non-negative amount" in _one_sentence(proc)


def test_an_unreachable_broker_is_status_3_naming_the_address_and_the_setting(
    settings: Settings, tmp_path: Path
) -> None:
    records = tmp_path / "usage.jsonl"
    records.write_text('{"usage_id": "u1"}\n')
    env = settings_env(settings)
    env["BILLING_LEDGER_KAFKA_BOOTSTRAP"] = "127.0.0.1:1"
    proc = _cli("produce", str(records), env=env)
    assert proc.returncode == 3
    said = _one_sentence(proc)
    assert "no Kafka broker answered (127.0.0.1:1:" in said
    assert "BILLING_LEDGER_KAFKA_BOOTSTRAP" in said


def test_an_unreachable_database_is_status_3_naming_the_setting(settings: Settings) -> None:
    env = settings_env(settings)
    env["BILLING_LEDGER_DATABASE_URL"] = "postgresql://nobody@127.0.0.1:1/none?connect_timeout=1"
    proc = _cli("accounts", "show", "acme", "USD", env=env)
    assert proc.returncode == 3
    said = _one_sentence(proc)
    assert said.startswith("billing-ledger: error: cannot reach PostgreSQL")
    assert "BILLING_LEDGER_DATABASE_URL" in said


def test_an_audit_with_an_anchor_file_and_nothing_anchored_says_how_to_anchor(
    settings: Settings, tmp_path: Path
) -> None:
    migrate(settings)
    env = settings_env(settings)
    env["BILLING_LEDGER_ANCHOR_PATH"] = str(tmp_path / "anchors.log")
    env["BILLING_LEDGER_ANCHOR_KEY"] = "k" * 32
    proc = _cli("audit", env=env)
    assert proc.returncode == 1  # a check that failed
    assert "None" not in proc.stdout
    assert f"anchor: no signed checkpoint in {tmp_path / 'anchors.log'} yet" in proc.stdout
    assert "`billing-ledger anchor` signs one" in proc.stdout


def test_a_period_that_is_not_one_says_the_forms_it_takes(settings: Settings) -> None:
    proc = _cli("invoices", "close", "--period", "december", env=settings_env(settings))
    assert proc.returncode == 2
    assert "'december' is not a period: give YYYY-MM (2026-12)" in _one_sentence(proc)


def test_version_and_debug(settings: Settings) -> None:
    env = settings_env(settings)
    version = _cli("--version", env=env)
    assert version.returncode == 0
    assert re.fullmatch(r"billing-ledger \d+\.\d+\.\d+\n", version.stdout)
    env["BILLING_LEDGER_DATABASE_URL"] = "postgresql://nobody@127.0.0.1:1/none?connect_timeout=1"
    debug = _cli("--debug", "accounts", "show", "acme", "USD", env=env)
    assert debug.returncode == 3
    assert "Traceback (most recent call last)" in debug.stderr
    assert debug.stderr.strip().splitlines()[-1].startswith("billing-ledger: error: cannot reach")


def test_the_embedded_postgres_of_up_makes_a_data_dir_whose_parents_do_not_exist(
    tmp_path: Path,
) -> None:
    data = tmp_path / "not" / "made" / "yet"
    with EmbeddedPostgres(data) as pg, psycopg.connect(pg.owner_url) as conn:
        assert conn.execute("SELECT 1").fetchone() == (1,)
    assert (data / "pgdata" / "PG_VERSION").is_file()  # kept: the user's folder
