"""Databases owned by a schema owner that is not a superuser, as the embedded default
makes them (``infra.embedded``): for the tests of least privilege."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import psycopg
from psycopg import errors as pgerrors
from psycopg import sql
from psycopg.conninfo import make_conninfo

from infra.embedded import OWNER


@contextmanager
def owned_database(server_url: str) -> Iterator[str]:
    """A new database owned by ``billing_owner`` (made when missing) on the server of
    ``server_url`` (a superuser's login); yields its superuser URL; dropped at the end."""
    name = f"t_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(server_url, autocommit=True) as conn:
        if not conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (OWNER,)).fetchone():
            # made at the same moment by another test: fine
            with contextlib.suppress(pgerrors.DuplicateObject, pgerrors.UniqueViolation):
                conn.execute(
                    sql.SQL("CREATE ROLE {} LOGIN CREATEROLE NOSUPERUSER").format(
                        sql.Identifier(OWNER)
                    )
                )
        conn.execute(
            sql.SQL("CREATE DATABASE {} OWNER {}").format(
                sql.Identifier(name), sql.Identifier(OWNER)
            )
        )
    try:
        yield make_conninfo(server_url, dbname=name)
    finally:
        with psycopg.connect(server_url, autocommit=True) as conn:
            conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )


def as_role(url: str, role: str) -> str:
    """``url`` logging in as ``role`` (the test servers trust local logins)."""
    return make_conninfo(url, user=role)
