"""Queue health: how billing is doing and what is stuck, as SQL any user can query.

Objects in the ``billing`` schema:

* ``billing.queue_health`` (a view, one row): backlog by state, the age of the oldest
  unfinished transaction, retries due now, stale reservations, transactions past
  their deadline, dead letters in the last hour, Stripe errors in the last 1/5/15
  minutes (and by error class), charges in the last minute, the largest consumer
  lag, live and silent workers, and workers whose circuit breaker is not closed.
* ``billing.stuck_transactions`` (a view): every unfinished transaction that should
  have moved by now, with why (``stuck_because``) and its last error.
* ``billing.workers``: one row per worker process, its heartbeat and breaker state
  (written by the workers every ``heartbeat_interval_s``; removed when a worker stops
  cleanly; a silent one is reported, then forgotten after an hour).
* ``billing.consumer_lag``: per consumer group, topic and partition, the committed
  offset, the end of the partition and the lag (written by the workers; a row older
  than the heartbeat timeout is shown as not fresh and left out of the figures).
* ``billing.health_settings``: the deadlines the view judges by (written at start).

The view reads the projections (``billing.transactions``, ``billing.charge_attempts``)
and ``billing.dead_letters``, so it is only as current as the projector; its
``projector_behind`` column says how many events (up to 100,000) the slowest
projection has still to apply.

``assess()`` turns the figures into a status (ok, degraded, failing) with reasons.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import psycopg
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

__all__ = [
    "SCHEMA_SQL",
    "Thresholds",
    "WorkerBeat",
    "assess",
    "forget_worker",
    "read_health",
    "record_heartbeat",
    "record_lag",
    "write_settings",
]

OK, DEGRADED, FAILING = "ok", "degraded", "failing"
FORGET_SILENT_AFTER_S = 3600.0  # a worker silent this long is dropped from billing.workers

SCHEMA_SQL = """
CREATE SCHEMA IF NOT EXISTS billing;
CREATE TABLE IF NOT EXISTS billing.health_settings (
    id                   integer PRIMARY KEY CHECK (id = 1),
    retry_horizon_s      double precision NOT NULL,
    reconcile_interval_s double precision NOT NULL,
    stale_after_s        double precision NOT NULL,
    heartbeat_timeout_s  double precision NOT NULL
);
INSERT INTO billing.health_settings VALUES (1, 3600, 5, 30, 30) ON CONFLICT (id) DO NOTHING;
CREATE TABLE IF NOT EXISTS billing.workers (
    worker_id     text        PRIMARY KEY,
    roles         text[]      NOT NULL,
    host          text        NOT NULL,
    pid           integer     NOT NULL,
    started_at    timestamptz NOT NULL,
    heartbeat_at  timestamptz NOT NULL,
    breaker_state text,
    stats         jsonb       NOT NULL DEFAULT '{}'
);
CREATE TABLE IF NOT EXISTS billing.consumer_lag (
    group_name       text        NOT NULL,
    topic            text        NOT NULL,
    partition        integer     NOT NULL,
    committed_offset bigint      NOT NULL,
    end_offset       bigint      NOT NULL,
    lag              bigint      NOT NULL,
    recorded_at      timestamptz NOT NULL,
    PRIMARY KEY (group_name, topic, partition)
);
-- The views wrap SQL functions, whose bodies are bound when they run: a projection
-- rebuild can drop and rename billing.transactions without touching the views.
CREATE OR REPLACE FUNCTION billing.stuck_transactions_now() RETURNS TABLE (
    transaction_id uuid, customer_id text, usage_id text, amount bigint, currency text,
    state text, attempts integer, last_error text, next_attempt_at timestamptz,
    metered_at timestamptz, deadline_at timestamptz, stuck_because text
) LANGUAGE sql STABLE AS $body$
SELECT t.transaction_id, t.customer_id, t.usage_id, t.amount, t.currency::text, t.state,
       t.attempts, t.last_error, t.next_attempt_at, t.metered_at,
       t.metered_at + make_interval(secs => s.retry_horizon_s),
       CASE
         WHEN t.metered_at + make_interval(secs => s.retry_horizon_s + s.reconcile_interval_s)
              < now() THEN 'past its deadline'
         WHEN t.state = 'charge_failed'
              AND t.next_attempt_at + make_interval(secs => 2 * s.reconcile_interval_s) < now()
              THEN 'retry overdue'
         WHEN t.state = 'charge_failed' THEN 'retry due'
         WHEN t.state = 'reserved' THEN 'not charged after stale_after_s'
         ELSE 'metered but neither reserved nor compensated'
       END
FROM billing.transactions t, billing.health_settings s
WHERE t.state IN ('metered', 'reserved', 'charge_failed')
  AND (t.metered_at + make_interval(secs => s.retry_horizon_s + s.reconcile_interval_s) < now()
       OR (t.state = 'charge_failed' AND t.next_attempt_at <= now())
       OR (t.state <> 'charge_failed'
           AND coalesce(t.reserved_at, t.metered_at) + make_interval(secs => s.stale_after_s)
               < now()))
$body$;
CREATE OR REPLACE VIEW billing.stuck_transactions AS
SELECT * FROM billing.stuck_transactions_now();

CREATE OR REPLACE FUNCTION billing.queue_health_now() RETURNS TABLE (
    observed_at timestamptz, backlog_metered bigint, backlog_reserved bigint,
    backlog_charge_failed bigint, oldest_open_at timestamptz, oldest_open_age_s double precision,
    retries_due bigint, retries_overdue bigint, stale_reserved bigint, past_deadline bigint,
    dead_letters_last_hour bigint, stripe_errors_1m bigint, stripe_errors_5m bigint,
    stripe_errors_15m bigint, stripe_errors_by_class jsonb, charges_last_minute bigint,
    max_consumer_lag bigint, workers_alive bigint, workers_silent bigint,
    breakers_not_closed bigint, projector_behind bigint
) LANGUAGE sql STABLE AS $body$
WITH s AS (SELECT * FROM billing.health_settings WHERE id = 1),
open AS (
    SELECT state, count(*) AS n, min(metered_at) AS oldest
    FROM billing.transactions
    WHERE state IN ('metered', 'reserved', 'charge_failed')
    GROUP BY state
),
stuck AS (SELECT stuck_because, count(*) AS n FROM billing.stuck_transactions_now() GROUP BY 1),
errors AS (
    SELECT error_class,
           count(*) FILTER (WHERE at > now() - interval '1 minute') AS m1,
           count(*) FILTER (WHERE at > now() - interval '5 minutes') AS m5,
           count(*) AS m15
    FROM billing.charge_attempts
    WHERE outcome = 'failed' AND at > now() - interval '15 minutes'
    GROUP BY error_class
),
workers AS (
    SELECT w.breaker_state,
           w.heartbeat_at > now() - make_interval(secs => s.heartbeat_timeout_s) AS alive
    FROM billing.workers w, s
)
SELECT
    now(),
    coalesce((SELECT n FROM open WHERE state = 'metered'), 0),
    coalesce((SELECT n FROM open WHERE state = 'reserved'), 0),
    coalesce((SELECT n FROM open WHERE state = 'charge_failed'), 0),
    (SELECT min(oldest) FROM open),
    coalesce(extract(epoch FROM now() - (SELECT min(oldest) FROM open)), 0)::double precision,
    (SELECT count(*) FROM billing.transactions
      WHERE state = 'charge_failed' AND next_attempt_at <= now()),
    coalesce((SELECT n FROM stuck WHERE stuck_because = 'retry overdue'), 0),
    coalesce((SELECT n FROM stuck WHERE stuck_because = 'not charged after stale_after_s'), 0),
    coalesce((SELECT n FROM stuck WHERE stuck_because = 'past its deadline'), 0),
    (SELECT count(*) FROM billing.dead_letters WHERE received_at > now() - interval '1 hour'),
    coalesce((SELECT sum(m1) FROM errors), 0)::bigint,
    coalesce((SELECT sum(m5) FROM errors), 0)::bigint,
    coalesce((SELECT sum(m15) FROM errors), 0)::bigint,
    coalesce((SELECT jsonb_object_agg(error_class,
                       jsonb_build_object('1m', m1, '5m', m5, '15m', m15)) FROM errors),
             '{}'::jsonb),
    (SELECT count(*) FROM billing.charge_attempts
      WHERE outcome = 'charged' AND at > now() - interval '1 minute'),
    coalesce((SELECT max(l.lag) FROM billing.consumer_lag l, s
              WHERE l.recorded_at > now() - make_interval(secs => s.heartbeat_timeout_s)), 0),
    (SELECT count(*) FROM workers WHERE alive),
    (SELECT count(*) FROM workers WHERE NOT alive),
    (SELECT count(*) FROM workers WHERE alive AND breaker_state <> 'closed'),
    coalesce((SELECT max((SELECT count(*) FROM (
                 SELECT 1 FROM billingledger_events e
                 WHERE (e.xid, e.notification_id) > (p.xid, p.notification_id)
                 LIMIT 100000) behind))
              FROM billing.projection_positions p), 0)
$body$;
CREATE OR REPLACE VIEW billing.queue_health AS SELECT * FROM billing.queue_health_now();
"""


def write_settings(
    conn: psycopg.Connection[Any],
    *,
    retry_horizon_s: float,
    reconcile_interval_s: float,
    stale_after_s: float,
    heartbeat_timeout_s: float,
) -> None:
    """Record the deadlines ``billing.queue_health`` judges by."""
    conn.execute(
        "UPDATE billing.health_settings SET retry_horizon_s = %s, reconcile_interval_s = %s,"
        " stale_after_s = %s, heartbeat_timeout_s = %s WHERE id = 1",
        (retry_horizon_s, reconcile_interval_s, stale_after_s, heartbeat_timeout_s),
    )


@dataclass(frozen=True)
class WorkerBeat:
    """What a worker process says about itself at each heartbeat."""

    worker_id: str
    roles: list[str]
    host: str
    pid: int
    started_at: datetime
    breaker_state: str | None = None
    stats: Mapping[str, Any] = field(default_factory=dict)


def record_heartbeat(conn: psycopg.Connection[Any], beat: WorkerBeat) -> None:
    conn.execute(
        "INSERT INTO billing.workers AS w VALUES (%s, %s, %s, %s, %s, now(), %s, %s)"
        " ON CONFLICT (worker_id) DO UPDATE SET heartbeat_at = now(),"
        " breaker_state = excluded.breaker_state, stats = excluded.stats,"
        " roles = excluded.roles, host = excluded.host, pid = excluded.pid,"
        " started_at = excluded.started_at",
        (
            beat.worker_id,
            beat.roles,
            beat.host,
            beat.pid,
            beat.started_at,
            beat.breaker_state,
            Jsonb(dict(beat.stats)),
        ),
    )
    conn.execute(
        "DELETE FROM billing.workers WHERE heartbeat_at < now() - make_interval(secs => %s)",
        (FORGET_SILENT_AFTER_S,),
    )


def forget_worker(conn: psycopg.Connection[Any], worker_id: str) -> None:
    """Remove a worker that stopped cleanly (a crashed one stays, silent, for an hour)."""
    conn.execute("DELETE FROM billing.workers WHERE worker_id = %s", (worker_id,))


def record_lag(
    conn: psycopg.Connection[Any], group: str, topic: str, offsets: Mapping[int, tuple[int, int]]
) -> None:
    """Store ``{partition: (committed, end)}`` for ``group`` on ``topic``."""
    with conn.cursor() as cur:
        cur.executemany(
            "INSERT INTO billing.consumer_lag VALUES (%s, %s, %s, %s, %s, %s, now())"
            " ON CONFLICT (group_name, topic, partition) DO UPDATE SET"
            " committed_offset = excluded.committed_offset, end_offset = excluded.end_offset,"
            " lag = excluded.lag, recorded_at = excluded.recorded_at",
            [
                (group, topic, p, committed, end, max(end - committed, 0))
                for p, (committed, end) in sorted(offsets.items())
            ],
        )
        cur.execute(
            "DELETE FROM billing.consumer_lag"
            " WHERE recorded_at < now() - make_interval(secs => %s)",
            (FORGET_SILENT_AFTER_S,),
        )


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
    plain: dict[str, Any] = _plain({**figures, "workers": workers, "consumer_lag": lag})
    return plain


@dataclass(frozen=True)
class Thresholds:
    """When a figure makes billing degraded rather than ok."""

    max_consumer_lag: int = 10_000
    max_stripe_errors_5m: int = 0
    max_projector_behind: int = 10_000
    max_loop_age_s: float = 300.0  # a role whose loop has not turned this long is hung


def assess(figures: Mapping[str, Any], limits: Thresholds = Thresholds()) -> tuple[str, list[str]]:
    """The status (ok, degraded, failing) the figures mean, and why.

    Failing: a transaction is past its deadline (invariant I2 is broken) or nothing is
    alive to do the work. Degraded: something is late or refused but still recoverable.
    """
    failing: list[str] = []
    degraded: list[str] = []
    if figures["past_deadline"]:
        failing.append(f"{figures['past_deadline']} transaction(s) past their deadline")
    open_work = figures["backlog_metered"] + figures["backlog_reserved"]
    if not figures["workers_alive"] and open_work + figures["backlog_charge_failed"]:
        failing.append("no live worker while transactions are unfinished")
    for worker in figures.get("workers", ()):
        degraded += _worker_reasons(worker, limits)
    if figures["retries_overdue"]:
        degraded.append(f"{figures['retries_overdue']} retry(ies) overdue")
    if figures["stale_reserved"]:
        degraded.append(f"{figures['stale_reserved']} reserved transaction(s) not charged")
    if figures["dead_letters_last_hour"]:
        degraded.append(f"{figures['dead_letters_last_hour']} dead letter(s) in the last hour")
    if figures["stripe_errors_5m"] > limits.max_stripe_errors_5m:
        by_class = ", ".join(
            f"{name}: {counts['5m']}"
            for name, counts in sorted(figures["stripe_errors_by_class"].items())
            if counts["5m"]
        )
        degraded.append(f"{figures['stripe_errors_5m']} Stripe error(s) in 5 min ({by_class})")
    if figures["max_consumer_lag"] > limits.max_consumer_lag:
        degraded.append(f"consumer lag {figures['max_consumer_lag']}")
    if figures["projector_behind"] > limits.max_projector_behind:
        degraded.append(
            f"projector {figures['projector_behind']} events behind: these figures lag the log"
        )
    if failing:
        return FAILING, failing + degraded
    return (DEGRADED, degraded) if degraded else (OK, [])


def _worker_reasons(worker: Mapping[str, Any], limits: Thresholds) -> list[str]:
    """Silent; or alive with a breaker not closed, or a role whose loop stopped turning."""
    name = worker["worker_id"]
    if not worker["alive"]:
        return [f"worker {name} silent since {worker['heartbeat_at']}"]
    reasons = []
    if worker["breaker_state"] not in (None, "closed"):
        reasons.append(f"Stripe circuit breaker {worker['breaker_state']} in worker {name}")
    for role, age in (worker.get("stats") or {}).get("loop_age_s", {}).items():
        if age > limits.max_loop_age_s:
            reasons.append(f"worker {name}: {role} has not gone round for {age:.0f} s")
    return reasons


def _plain(value: Any) -> Any:
    """JSON-ready: datetimes as ISO text, Decimals as numbers (via a JSON round trip)."""
    return json.loads(json.dumps(value, default=_default))


def _default(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    return float(value) if hasattr(value, "as_integer_ratio") else str(value)
