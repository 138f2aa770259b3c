"""The one way to reach PostgreSQL: a ``Database`` per process, built from its URL.

A worker process holds connections for its whole life, so ``connection()`` lends one
from a small pool (psycopg_pool), opened on first use; it commits when the block ends
and rolls back when it raises. With ``pool_size=0`` (a one-off command, a part built
on its own) each ``connection()`` is a fresh connection, closed at the end of the
block, so there is no pool to close. A follower that keeps one session for hours (the relay,
the projector) takes a ``dedicated()`` connection of its own instead, so a pooled
connection is never held by a loop. Nothing connects at import or construction time.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg_pool import ConnectionPool

__all__ = ["Database", "redact"]


class Database:
    """Connections to the database at ``url`` (see the module docstring)."""

    def __init__(
        self,
        url: str,
        *,
        pool_size: int = 0,
        connect_timeout_s: int = 10,
        statement_timeout_ms: int | None = None,
        wait_s: float = 30.0,
        name: str = "billing-ledger",
    ) -> None:
        self.url = url
        self.pool_size = pool_size
        self.name = name
        self.wait_s = wait_s  # how long a caller waits for a pooled connection
        self._kwargs: dict[str, Any] = {"connect_timeout": connect_timeout_s}
        if statement_timeout_ms is not None:
            self._kwargs["options"] = f"-c statement_timeout={statement_timeout_ms}"
        self._pool: ConnectionPool[psycopg.Connection[Any]] | None = None
        self._guard = threading.Lock()

    @contextmanager
    def connection(self) -> Iterator[psycopg.Connection[Any]]:
        """A pooled connection for one unit of work: committed at the end of the block,
        rolled back if it raises."""
        if self.pool_size <= 0:
            with psycopg.connect(self.url, **self._kwargs) as conn:
                yield conn
            return
        with self._opened().connection() as conn:
            yield conn

    def dedicated(self, *, autocommit: bool = False) -> psycopg.Connection[Any]:
        """A connection of the caller's own, outside the pool (the caller closes it)."""
        return psycopg.connect(self.url, autocommit=autocommit, **self._kwargs)

    def close(self) -> None:
        with self._guard:
            if self._pool is not None:
                self._pool.close()
                self._pool = None

    def __enter__(self) -> Database:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _opened(self) -> ConnectionPool[psycopg.Connection[Any]]:
        with self._guard:
            if self._pool is None:
                self._pool = ConnectionPool(
                    self.url,
                    min_size=1,
                    max_size=self.pool_size,
                    kwargs=self._kwargs,
                    name=self.name,
                    timeout=self.wait_s,
                    open=False,
                )
                self._pool.open(wait=False)
            return self._pool


def redact(url: str) -> str:
    """``url`` with its password replaced by ``***`` (for errors and log lines)."""
    try:
        params = conninfo_to_dict(url)
    except psycopg.ProgrammingError:
        return "<an unparsable database URL>"
    if params.get("password"):
        params["password"] = "***"  # noqa: S105 (a mask, not a password)
    return make_conninfo("", **params)
