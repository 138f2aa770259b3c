"""Queue health: how billing is doing and what is stuck, as SQL any user can query.

Objects in the ``billing`` schema:

* ``billing.queue_health`` (a view, one row): backlog by state, the age of the oldest
  unfinished transaction, retries due now, stale reservations, transactions past
  their deadline, dead letters in the last hour (and ever, from
  ``billing.dead_letter_counts``, which retention does not touch), conflicting
  duplicates in the last hour, Stripe errors in the last 1/5/15
  minutes (and by error class), charges in the last minute, the largest consumer
  lag, live and silent workers, workers whose circuit breaker is not closed, and
  the invoice lines: unsent, failing, past their deadline, the age of the oldest
  unsent change, and Stripe requests per 1,000 records in the last hour.
* ``billing.stuck_transactions`` (a view): every unfinished transaction that should
  have moved by now, with why (``stuck_because``) and its last error.

The view reads the projections (``billing.transactions``, ``billing.charge_attempts``),
``billing.dead_letters`` and what the workers write (``billing.workers`` and
``billing.consumer_lag``, by ``adapters.observability.heartbeat``), judged by the
deadlines in ``billing.health_settings`` (``write_settings``: each worker writes its
own settings there at start, and the last one to start wins). It is only as current as
the projector; its ``projector_behind`` column says how many events (up to 100,000)
the slowest projection has still to apply. The views, and the SQL functions they wrap
(so that a rebuild can swap the tables they read), are made by the migrations
(``store.migrations``).

``read_health()`` is the query the CLI, the health server and the metrics read;
``domain.health.assess`` turns its figures into a status with reasons.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

import psycopg
from psycopg.rows import dict_row

__all__ = ["read_health", "write_settings"]


def write_settings(
    conn: psycopg.Connection[Any],
    *,
    retry_horizon_s: float,
    reconcile_interval_s: float,
    stale_after_s: float,
    heartbeat_timeout_s: float,
    invoice_grace_s: float = 3600.0,
) -> None:
    """Record the deadlines ``billing.queue_health`` judges by (one row: the last writer
    wins). DML only: the row exists from migration 1 on."""
    conn.execute(
        "UPDATE billing.health_settings SET retry_horizon_s = %s, reconcile_interval_s = %s,"
        " stale_after_s = %s, heartbeat_timeout_s = %s, invoice_grace_s = %s WHERE id = 1",
        (retry_horizon_s, reconcile_interval_s, stale_after_s, heartbeat_timeout_s,
         invoice_grace_s),
    )  # fmt: skip


def read_health(conn: psycopg.Connection[Any]) -> dict[str, Any]:
    """The ``queue_health`` row, with the workers and the consumer lag, as plain data."""
    with conn.cursor(row_factory=dict_row) as cur:
        figures = cur.execute("SELECT * FROM billing.queue_health").fetchone() or {}
        workers = cur.execute(
            "SELECT w.worker_id, w.roles, w.host, w.pid, w.started_at, w.heartbeat_at,"
            " w.breaker_state, w.stats,"
            " w.heartbeat_at > now() - make_interval(secs => s.heartbeat_timeout_s) AS alive"
            " FROM billing.workers w, billing.health_settings s ORDER BY w.worker_id"
        ).fetchall()
        lag = cur.execute(
            "SELECT l.group_name, l.topic, l.partition, l.committed_offset, l.end_offset, l.lag,"
            " l.recorded_at,"
            " l.recorded_at > now() - make_interval(secs => s.heartbeat_timeout_s) AS fresh"
            " FROM billing.consumer_lag l, billing.health_settings s"
            " ORDER BY l.group_name, l.topic, l.partition"
        ).fetchall()
        attention = cur.execute(
            "SELECT invoice_id, customer_id, state, attention FROM billing.invoices"
            " WHERE attention IS NOT NULL ORDER BY updated_at LIMIT 20"
        ).fetchall()
        counted = cur.execute(
            "SELECT count(*) AS n FROM billing.invoices WHERE attention IS NOT NULL"
        ).fetchone()
        purchases = cur.execute(
            "SELECT purchase_id, customer_id, currency, grant_id, reason"
            " FROM billing.credit_purchases WHERE state = 'needs_attention'"
            " ORDER BY updated_at LIMIT 20"
        ).fetchall()
        purchases_counted = cur.execute(
            "SELECT count(*) AS n FROM billing.credit_purchases WHERE state = 'needs_attention'"
        ).fetchone()
    plain: dict[str, Any] = _plain(
        {
            **figures,
            "workers": workers,
            "consumer_lag": lag,
            "invoices_needing_attention": counted["n"] if counted else 0,
            "invoices_attention": attention,
            "purchases_needing_attention": purchases_counted["n"] if purchases_counted else 0,
            "purchases_attention": purchases,
        }
    )
    return plain


def _plain(value: Any) -> Any:
    """JSON-ready: datetimes as ISO text, Decimals as numbers (via a JSON round trip)."""
    return json.loads(json.dumps(value, default=_default))


def _default(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    return float(value) if hasattr(value, "as_integer_ratio") else str(value)
