"""``python -m tools.bench_alert_sending``: how fast the ``alerts`` role sends webhooks to
one endpoint, its deliveries already in the table.

The embedded default (a private PostgreSQL, and the broker the migrations need), one
endpoint on a receiver on 127.0.0.1 in a process of its own (``tools.loopback``, HTTP/1.1
keep-alive unless ``--no-keep-alive``), ``--deliveries`` pending deliveries of as many
alerts, and the role's sending part (``AlertWebhooks`` without a consumer, as ``run``
builds it, ``--concurrency`` requests in flight) in this process until every delivery is
recorded delivered. Printed: deliveries a second, and the CPU this process used a
delivery (the dispatcher, the lane threads, the database client). Numbers, no verdict.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import threading
import time
from typing import Any
from uuid import uuid4

from adapters.alerts import deliveries
from adapters.alerts.messages import Alert
from adapters.alerts.worker import AlertWebhooks
from adapters.bootstrap import database, migrate, prepare
from adapters.observability.logs import configure_logging
from adapters.settings import Settings
from infra.embedded import EmbeddedPostgres, TansuBroker
from tools.loopback import serve_posts
from tools.measure import cores

__all__ = ["main", "run_sending"]


def _serve(ports: multiprocessing.Queue[int], keep_alive: bool) -> None:
    server, _ = serve_posts(lambda body, headers: (204, {}), "/alerts", keep_alive=keep_alive)
    ports.put(int(server.server_address[1]))
    threading.Event().wait()  # serving until terminated


def run_sending(count: int, concurrency: int, keep_alive: bool = True) -> dict[str, Any]:
    """The measurement (see the module docstring)."""
    context = multiprocessing.get_context("spawn")
    ports: multiprocessing.Queue[int] = context.Queue()
    receiver = context.Process(target=_serve, args=(ports, keep_alive), daemon=True)
    receiver.start()
    try:
        url = f"http://127.0.0.1:{ports.get(timeout=60)}/alerts"
        with EmbeddedPostgres() as pg, TansuBroker() as broker:
            settings = Settings(
                database_url=pg.url,
                kafka_bootstrap=broker.bootstrap,
                alert_webhook_allow_private=True,  # the receiver is on 127.0.0.1
                alert_webhook_concurrency=concurrency,
            )
            migrate(settings)
            prepare(settings)
            db = database(settings)
            alerts = [
                Alert(str(uuid4()), "alert.crossed", "bench", json.dumps({"i": i}).encode())
                for i in range(count)
            ]
            with db.connection() as conn:
                deliveries.add_endpoint(conn, url, ["alert.crossed"])
                deliveries.fan_out(conn, alerts)
            role = AlertWebhooks(db, None, settings.alert_delivery_policy())
            stop = threading.Event()
            started, cpu = time.perf_counter(), time.process_time()
            sending = threading.Thread(target=role.run, args=(stop,))
            sending.start()
            while role.delivered < count and sending.is_alive():
                time.sleep(0.01)
            elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu
            stop.set()
            sending.join()
            db.close()
    finally:
        receiver.terminate()
        receiver.join(timeout=10)
    return {
        "cores": cores(),
        "deliveries": count,
        "concurrency": concurrency,
        "receiver_keep_alive": keep_alive,
        "delivered": role.delivered,
        "failed_attempts": role.failed_attempts,
        "deliveries_per_s": round(role.delivered / elapsed, 1),
        "cpu_us_per_delivery": round(1e6 * cpu / max(role.delivered, 1)),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tools.bench_alert_sending", description=__doc__
    )
    parser.add_argument("--deliveries", type=int, default=3000, help="pending deliveries")
    parser.add_argument("--concurrency", type=int, default=8, help="requests in flight")
    parser.add_argument(
        "--no-keep-alive", action="store_true", help="the receiver closes after each answer"
    )
    args = parser.parse_args(argv)
    configure_logging("ERROR")
    report = run_sending(args.deliveries, args.concurrency, keep_alive=not args.no_keep_alive)
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
