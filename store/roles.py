"""The database roles of least privilege, as ``migrate`` checks them (issue 13).

Migration 4 makes ``billing_writer`` (the workers), ``billing_reader`` (people and
dashboards) and ``billing_auditor`` (``audit``, ``export``) and grants them what each
needs in the migrated database. Roles belong to the cluster, not the database, so
``migrate`` checks them on every run, whoever made them: a role that exists with more
power than its grants (a superuser, CREATEROLE, CREATEDB, replication, BYPASSRLS, or
membership of a role that reads or runs server files) is refused, since a process
logged in as it could skip every control the grants set.

Passwords: when the settings hold one for a role, ``migrate`` sets it as a SCRAM-SHA-256
verifier computed here, so the password itself never reaches the server (nor its
statement log). With none, the role keeps what it has (the embedded default logs in
over a private Unix socket with trust authentication).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
from collections.abc import Mapping
from typing import Any

import psycopg
from psycopg import errors as pgerrors
from psycopg import sql

from store.errors import RolesUnsafe

__all__ = [
    "AUDITOR",
    "READER",
    "ROLES",
    "WRITER",
    "check_roles",
    "scram_verifier",
    "set_passwords",
]

WRITER = "billing_writer"
READER = "billing_reader"
AUDITOR = "billing_auditor"
ROLES = (WRITER, READER, AUDITOR)

# Built-in roles whose members read or write server files or run programs on the server.
_DANGEROUS_MEMBERSHIPS = (
    "pg_execute_server_program",
    "pg_read_server_files",
    "pg_write_server_files",
    "pg_write_all_data",
    "pg_database_owner",
)
_ATTRIBUTES = sql.SQL(
    "SELECT rolname, rolsuper, rolcreaterole, rolcreatedb, rolreplication, rolbypassrls,"
    " ARRAY(SELECT b.rolname FROM pg_auth_members m JOIN pg_roles b ON b.oid = m.roleid"
    "       WHERE m.member = r.oid)"
    " FROM pg_roles r WHERE rolname = ANY(%s)"
)


def check_roles(conn: psycopg.Connection[Any]) -> None:
    """Raise ``RolesUnsafe`` naming every role that is missing or holds more power
    than least privilege allows."""
    rows = {r[0]: r for r in conn.execute(_ATTRIBUTES, (list(ROLES),)).fetchall()}
    problems: list[str] = []
    for role in ROLES:
        row = rows.get(role)
        if row is None:
            problems.append(f"{role} does not exist")
            continue
        _, superuser, createrole, createdb, replication, bypassrls, member_of = row
        powers = [
            name
            for name, held in (
                ("SUPERUSER", superuser),
                ("CREATEROLE", createrole),
                ("CREATEDB", createdb),
                ("REPLICATION", replication),
                ("BYPASSRLS", bypassrls),
            )
            if held
        ]
        powers += [f"member of {m}" for m in member_of if m in _DANGEROUS_MEMBERSHIPS]
        if powers:
            problems.append(f"{role} has {', '.join(powers)}")
    if problems:
        raise RolesUnsafe(
            "database roles are not least-privilege: " + "; ".join(problems)
            + " (fix them as a superuser: ALTER ROLE ... NOSUPERUSER ..., REVOKE ...)"
        )  # fmt: skip


def set_passwords(conn: psycopg.Connection[Any], passwords: Mapping[str, str]) -> list[str]:
    """Give each role of ``passwords`` (a role of ``ROLES``) that password, as a SCRAM
    verifier; returns the roles changed. ``conn`` is in autocommit mode.

    Two ``migrate`` of two databases in one cluster may change a role at the same
    moment; PostgreSQL refuses the second ("tuple concurrently updated"), which is
    retried: the last one wins with the same password.
    """
    changed: list[str] = []
    for role, password in passwords.items():
        if role not in ROLES:
            raise ValueError(f"not a billing-ledger role: {role}")
        if not password:
            continue
        statement = sql.SQL("ALTER ROLE {} LOGIN PASSWORD {}").format(
            sql.Identifier(role), sql.Literal(scram_verifier(password))
        )
        for attempt in range(5):
            try:
                conn.execute(statement)
                break
            except pgerrors.InternalError_ as exc:
                if "concurrently" not in str(exc) or attempt == 4:
                    raise
        changed.append(role)
    return changed


def scram_verifier(password: str, *, iterations: int = 4096, salt: bytes | None = None) -> str:
    """The SCRAM-SHA-256 verifier PostgreSQL stores for ``password`` (RFC 5802/7677)."""
    salt = os.urandom(16) if salt is None else salt
    salted = hashlib.pbkdf2_hmac("sha256", password.encode(), salt, iterations)
    client_key = hmac.new(salted, b"Client Key", hashlib.sha256).digest()
    stored_key = hashlib.sha256(client_key).digest()
    server_key = hmac.new(salted, b"Server Key", hashlib.sha256).digest()

    def b64(data: bytes) -> str:
        return base64.b64encode(data).decode()

    return f"SCRAM-SHA-256${iterations}:{b64(salt)}${b64(stored_key)}:{b64(server_key)}"
