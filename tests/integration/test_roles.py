"""Least privilege against a real PostgreSQL (issue 13): ``migrate``, run by a schema
owner that is not a superuser, makes the writer, reader and auditor roles; the workers'
writer appends but cannot rewrite history, skip the append-only trigger or run shell
commands; the reader sees read models and queue health, not the history; concurrent
``migrate`` of many databases in one fresh cluster make each role once."""

from __future__ import annotations

import threading
from typing import Any

import psycopg
import pytest
from psycopg import errors as pgerrors

from adapters.bootstrap import build_projector, migrate, open_ledger
from adapters.settings import Settings
from infra.embedded import OWNER, EmbeddedPostgres
from infra.stripe_emulator import StripeEmulator
from projections.queue_health import read_health
from store.errors import RolesUnsafe
from store.roles import AUDITOR, READER, ROLES, WRITER, check_roles, scram_verifier
from tests.integration.roles import as_role, owned_database
from tests.integration.support import mixed_workload

pytestmark = pytest.mark.integration


def _refused(url: str, statement: str, params: tuple[Any, ...] = ()) -> str:
    """The SQLSTATE class name the statement fails with, as the login of ``url``."""
    with psycopg.connect(url) as conn:
        try:
            conn.execute(statement.encode() if not params else statement, params or None)
        except psycopg.Error as exc:
            return type(exc).__name__
    return "allowed"


def _is_superuser(url: str) -> bool:
    with psycopg.connect(url) as conn:
        row = conn.execute("SELECT rolsuper FROM pg_roles WHERE rolname = current_user").fetchone()
    return bool(row and row[0])


def test_migrate_as_an_owner_that_is_no_superuser_makes_the_three_roles(
    roles_settings: Settings, server: str
) -> None:
    assert not _is_superuser(as_role(server, OWNER))
    migrate(roles_settings)
    migrate(roles_settings)  # again: nothing to apply, the roles checked again
    with psycopg.connect(server) as conn:
        check_roles(conn)
        rows = conn.execute(
            "SELECT rolname, rolsuper, rolcreaterole, rolcreatedb, rolcanlogin FROM pg_roles"
            " WHERE rolname = ANY(%s) ORDER BY rolname",
            (list(ROLES),),
        ).fetchall()
    assert rows == [(r, False, False, False, True) for r in sorted(ROLES)]


def test_the_writer_runs_the_pipeline_but_cannot_rewrite_history(
    roles_settings: Settings, server: str, emulator: StripeEmulator
) -> None:
    migrate(roles_settings)
    writer = roles_settings.database_url
    assert not _is_superuser(writer)
    # Ingest, projections, pushes to Stripe, a reversal, dead letters: all as the writer.
    with open_ledger(roles_settings) as ledger, build_projector(roles_settings, ledger) as proj:
        mixed_workload(roles_settings, ledger, emulator, proj)
        proj.pump_all()
    with psycopg.connect(writer) as conn:
        assert conn.execute("SELECT count(*) FROM public.billingledger_events").fetchone() != (0,)
    # ... and none of the reproduction's steps.
    assert (
        _refused(writer, "UPDATE public.billingledger_events SET state = state")
        == "InsufficientPrivilege"
    )
    assert _refused(writer, "DELETE FROM public.billingledger_events") == "InsufficientPrivilege"
    assert _refused(writer, "TRUNCATE public.billingledger_events") == "InsufficientPrivilege"
    assert (
        _refused(writer, "UPDATE public.billingledger_snapshots SET state = state")
        == "InsufficientPrivilege"
    )
    assert _refused(writer, "DELETE FROM public.billingledger_snapshots") == "InsufficientPrivilege"
    assert (
        _refused(writer, "ALTER TABLE public.billingledger_events DISABLE TRIGGER ALL")
        == "InsufficientPrivilege"
    )
    assert _refused(writer, "SET session_replication_role = replica") == "InsufficientPrivilege"
    assert (
        _refused(writer, "CREATE TEMP TABLE t (x text); COPY t FROM PROGRAM 'id'")
        == "InsufficientPrivilege"
    )
    assert _refused(writer, "CREATE TABLE public.x (a int)") == "InsufficientPrivilege"
    assert _refused(writer, "CREATE TABLE billing.x (a int)") == "InsufficientPrivilege"
    assert _refused(writer, "ALTER ROLE billing_writer SUPERUSER") == "InsufficientPrivilege"
    assert _refused(writer, "SELECT pg_read_file('postgresql.con')") == "InsufficientPrivilege"


def test_the_reader_sees_read_models_and_health_but_not_the_history(
    roles_settings: Settings, server: str
) -> None:
    migrate(roles_settings)
    reader = as_role(server, READER)
    with psycopg.connect(reader) as conn:
        conn.execute("SELECT * FROM billing.transactions LIMIT 1")
        conn.execute("SELECT * FROM billing.customer_balances LIMIT 1")
        conn.execute("SELECT * FROM billing.invoice_preview LIMIT 1")
        # It reads the history as its owner: the price book migrate started (its Opened
        # and Published) is there, not yet projected.
        assert read_health(conn)["projector_behind"] == 2
    for statement in (
        "SELECT * FROM public.billingledger_events",
        "SELECT * FROM public.billingledger_snapshots",
        "SELECT * FROM billing.dead_letters",
        "SELECT * FROM billing.webhook_events",
        "INSERT INTO billing.workers (worker_id) VALUES ('x')",
        "DELETE FROM billing.transactions",
    ):
        assert _refused(reader, statement) == "InsufficientPrivilege", statement


def test_the_auditor_reads_the_history_and_writes_nothing(
    roles_settings: Settings, server: str
) -> None:
    migrate(roles_settings)
    auditor = as_role(server, AUDITOR)
    with psycopg.connect(auditor) as conn:
        conn.execute("SELECT * FROM public.billingledger_events LIMIT 1")
        conn.execute("SELECT * FROM billing.dead_letters LIMIT 1")
    for statement in (
        "INSERT INTO public.billingledger_events (originator_id, originator_version)"
        " VALUES (gen_random_uuid(), 1)",
        "UPDATE billing.transactions SET state = state",
        "DELETE FROM billing.dead_letters",
    ):
        assert _refused(auditor, statement) == "InsufficientPrivilege", statement


def test_migrate_refuses_a_role_that_is_more_than_its_grants(
    roles_settings: Settings, server: str
) -> None:
    """A billing role made by hand with CREATEDB (the cluster's, not this database's) is
    refused by every migrate, naming it."""
    migrate(roles_settings)
    with psycopg.connect(server, autocommit=True) as conn:
        conn.execute("ALTER ROLE billing_reader CREATEDB")
        try:
            with pytest.raises(RolesUnsafe, match="billing_reader has CREATEDB"):
                migrate(roles_settings)
        finally:
            conn.execute("ALTER ROLE billing_reader NOCREATEDB")


def test_passwords_from_the_settings_become_scram_verifiers(
    roles_settings: Settings, server: str
) -> None:
    from pydantic import SecretStr

    # As the cluster's superuser: on PostgreSQL 16+ only a role's creator (or a
    # superuser) may alter it, and another test's migrate may have made it first.
    migrate(
        roles_settings.model_copy(
            update={"auditor_password": SecretStr("audit-pw"), "migrate_database_url": server}
        )
    )
    with psycopg.connect(server) as conn:
        row = conn.execute(
            "SELECT rolpassword FROM pg_authid WHERE rolname = %s", (AUDITOR,)
        ).fetchone()
    assert row is not None and row[0].startswith("SCRAM-SHA-256$4096:")
    assert "audit-pw" not in row[0]
    assert scram_verifier("x", salt=b"s" * 16) == scram_verifier("x", salt=b"s" * 16)


def test_concurrent_migrates_of_many_databases_make_each_role_once() -> None:
    """A fresh cluster (no billing role yet) and six databases migrated at once: the
    role creation races, and every migrate succeeds with its grants in its database."""
    with EmbeddedPostgres() as pg:
        urls: list[str] = []
        stack = [owned_database(pg.url) for _ in range(6)]
        try:
            urls = [cm.__enter__() for cm in stack]
            errors: list[BaseException] = []
            start = threading.Barrier(len(urls))

            def run(url: str) -> None:
                try:
                    start.wait()
                    migrate(Settings(database_url=as_role(url, OWNER)))
                except BaseException as exc:  # reported below
                    errors.append(exc)

            threads = [threading.Thread(target=run, args=(u,)) for u in urls]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            assert errors == []
            for url in urls:
                with psycopg.connect(as_role(url, WRITER)) as conn:
                    conn.execute("SELECT count(*) FROM billing.transactions")
                    with pytest.raises(pgerrors.InsufficientPrivilege):
                        conn.execute("DELETE FROM public.billingledger_events")
        finally:
            for cm in stack:
                cm.__exit__(None, None, None)
