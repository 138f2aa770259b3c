"""The one way to reach PostgreSQL: a ``Database`` per process, built from its URL.

A worker process holds connections for its whole life, so ``connection()`` lends one
from a small pool (psycopg_pool), opened on first use; it commits when the block ends
and rolls back when it raises. With ``pool_size=0`` (a one-off command, a part built
on its own) each ``connection()`` is a fresh connection, closed at the end of the
block, so there is no pool to close. A follower that keeps one session for hours (the relay,
the projector) takes a ``dedicated()`` connection of its own instead, so a pooled
connection is never held by a loop. Nothing connects at import or construction time.

Secrets: the password may come apart from the URL (``password``: a Docker secret, a
``SecretStr`` setting), and is never part of an error's text: libpq echoes a URI it
cannot parse, password and all, so every connection error is re-raised with the URL
redacted and the password masked (``scrub``), in the pool's log lines too.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg_pool import ConnectionPool

__all__ = ["Database", "redact", "scrub"]


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
        password: str | None = None,
    ) -> None:
        self.url = url
        self.pool_size = pool_size
        self.name = name
        self.wait_s = wait_s  # how long a caller waits for a pooled connection
        self._kwargs: dict[str, Any] = {"connect_timeout": connect_timeout_s}
        if password:
            self._kwargs["password"] = password
        self._secrets = tuple(p for p in (password, _url_password(url)) if p)
        if statement_timeout_ms is not None:
            self._kwargs["options"] = f"-c statement_timeout={statement_timeout_ms}"
        self._pool: ConnectionPool[psycopg.Connection[Any]] | None = None
        self._guard = threading.Lock()

    @contextmanager
    def connection(self) -> Iterator[psycopg.Connection[Any]]:
        """A pooled connection for one unit of work: committed at the end of the block,
        rolled back if it raises."""
        if self.pool_size <= 0:
            with self.dedicated() as conn:
                yield conn
            return
        with self._opened().connection() as conn:
            yield conn

    def dedicated(self, *, autocommit: bool = False) -> psycopg.Connection[Any]:
        """A connection of the caller's own, outside the pool (the caller closes it)."""
        try:
            return psycopg.connect(self.url, autocommit=autocommit, **self._kwargs)
        except psycopg.Error as exc:
            raise _scrubbed(exc, self.url, self._secrets) from None

    def __repr__(self) -> str:
        return f"Database({redact(self.url)!r}, pool_size={self.pool_size})"

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
                    connection_class=_scrubbing_class(self.url, self._secrets),
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


_URI_PASSWORD = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*://[^:@/?#]*:([^@]*)@")
_KEYWORD_PASSWORD = re.compile(r"password\s*=\s*('(?:[^'\\]|\\.)*'|\S+)")


def _url_password(url: str) -> str | None:
    """The password written in ``url``, parsed or not (libpq may echo an unparsable one)."""
    try:
        found = conninfo_to_dict(url).get("password")
        if found:
            return str(found)
    except psycopg.ProgrammingError:
        pass
    match = _URI_PASSWORD.match(url) or _KEYWORD_PASSWORD.search(url)
    return match.group(1) if match else None


def scrub(text: str, url: str, secrets: tuple[str, ...] = ()) -> str:
    """``text`` without ``url`` (its redacted form instead) nor any of its secrets."""
    text = text.replace(url, redact(url)) if url else text
    for secret in (*secrets, _url_password(url) or ""):
        if secret:
            text = text.replace(secret, "***")
    return text


def _scrubbed(exc: psycopg.Error, url: str, secrets: tuple[str, ...]) -> psycopg.Error:
    """``exc`` again, of its own class, with a message that names no secret."""
    message = scrub(str(exc), url, secrets)
    if message == str(exc):
        return exc
    try:
        return type(exc)(message)
    except TypeError:  # a class that wants more arguments: the base one keeps the text
        return psycopg.OperationalError(message)


def _scrubbing_class(url: str, secrets: tuple[str, ...]) -> Any:
    """A connection class whose ``connect`` raises scrubbed errors (for the pool)."""

    class ScrubbingConnection(psycopg.Connection[Any]):
        @classmethod
        def connect(cls, *args: Any, **kwargs: Any) -> Any:
            try:
                return super().connect(*args, **kwargs)
            except psycopg.Error as exc:
                raise _scrubbed(exc, url, secrets) from None

    return ScrubbingConnection
