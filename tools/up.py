"""``billing-ledger up``: the embedded PostgreSQL and broker in the foreground, with the
exports another shell needs, until Ctrl-C. It migrates the new database and creates
the topics, so ``run`` can start at once."""

from __future__ import annotations

import signal
import threading
from pathlib import Path

from adapters.bootstrap import migrate, prepare
from adapters.settings import Settings
from infra.embedded import EmbeddedPostgres, TansuBroker
from store.roles import AUDITOR, READER, WRITER

__all__ = ["run_up"]


def run_up(data_dir: Path | None, kafka_port: int | None) -> None:
    with EmbeddedPostgres(data_dir) as pg, TansuBroker(kafka_port) as broker:
        settings = Settings(
            database_url=pg.role_url(WRITER),
            migrate_database_url=pg.owner_url,
            kafka_bootstrap=broker.bootstrap,
        )
        migrate(settings)
        prepare(settings)
        print("# embedded PostgreSQL and Tansu are up; in another shell:")
        print(f"export BILLING_LEDGER_DATABASE_URL='{pg.role_url(WRITER)}'  # the workers")
        print(f"export BILLING_LEDGER_MIGRATE_DATABASE_URL='{pg.owner_url}'  # migrate, rebuild")
        print(f"# people: {pg.role_url(READER)}")
        print(f"# audit, export: {pg.role_url(AUDITOR)}")
        print(f"export BILLING_LEDGER_KAFKA_BOOTSTRAP='{broker.bootstrap}'")
        print("# Ctrl-C stops both (the broker keeps messages in memory only)", flush=True)
        stop = threading.Event()
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: stop.set())
        stop.wait()
