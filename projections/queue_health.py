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
deadlines in ``billing.health_settings`` (``write_settings``, at start). It is only
as current as the projector; its ``projector_behind`` column says how many events
(up to 100,000) the slowest projection has still to apply.

``read_health()`` is the query the CLI, the health server and the metrics read;
``domain.health.assess`` turns its figures into a status with reasons.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

import psycopg
from psycopg.rows import dict_row

__all__ = ["SCHEMA_SQL", "read_health", "write_settings"]

SCHEMA_SQL = """
CREATE SCHEMA IF NOT EXISTS billing;
-- The views wrap SQL functions, whose bodies are bound when they run: a projection
-- rebuild can drop and rename billing.transactions without touching the views.
CREATE OR REPLACE FUNCTION billing.stuck_transactions_now() RETURNS TABLE (
    transaction_id uuid, customer_id text, usage_id text, amount numeric, currency text,
    state text, attempts integer, last_error text, next_attempt_at timestamptz,
    metered_at timestamptz, deadline_at timestamptz, stuck_because text
) LANGUAGE sql STABLE AS $body$
SELECT t.transaction_id, t.customer_id, t.usage_id, t.amount, t.currency::text, t.state,
       coalesce(l.push_attempts, t.attempts), coalesce(l.last_error, t.last_error),
       coalesce(l.next_attempt_at, t.next_attempt_at), t.metered_at,
       t.metered_at + make_interval(secs => s.retry_horizon_s),
       CASE
         WHEN t.metered_at + make_interval(secs => s.retry_horizon_s + s.reconcile_interval_s)
              < now() THEN 'past its deadline'
         WHEN l.push_attempts > 0 THEN 'its line is failing to reach Stripe'
         WHEN t.state = 'charge_failed'
              AND t.next_attempt_at + make_interval(secs => 2 * s.reconcile_interval_s) < now()
              THEN 'retry overdue'
         WHEN t.state = 'charge_failed' THEN 'retry due'
         WHEN t.state = 'reserved' THEN 'not charged after stale_after_s'
         ELSE 'metered but neither reserved nor compensated'
       END
FROM billing.transactions t
CROSS JOIN billing.health_settings s
LEFT JOIN billing.invoice_lines l ON l.line_id = t.line_id
WHERE t.state IN ('metered', 'reserved', 'charge_failed')
  AND (t.metered_at + make_interval(secs => s.retry_horizon_s + s.reconcile_interval_s) < now()
       OR (t.state = 'charge_failed' AND t.next_attempt_at <= now())
       OR (t.state <> 'charge_failed'
           AND coalesce(t.reserved_at, t.metered_at) + make_interval(secs => s.stale_after_s)
               < now()))
$body$;
CREATE OR REPLACE VIEW billing.stuck_transactions AS
SELECT * FROM billing.stuck_transactions_now();

-- A function's columns cannot change in place: drop one from before issue 11's columns.
DO $drop$ BEGIN
    IF EXISTS (SELECT 1 FROM pg_proc
               WHERE proname = 'queue_health_now' AND pronamespace = 'billing'::regnamespace
                 AND NOT 'stripe_requests_per_1000' = ANY(proargnames)) THEN
        DROP VIEW IF EXISTS billing.queue_health;
        DROP FUNCTION billing.queue_health_now();
    END IF;
END $drop$;

CREATE OR REPLACE FUNCTION billing.queue_health_now() RETURNS TABLE (
    observed_at timestamptz, backlog_metered bigint, backlog_reserved bigint,
    backlog_charge_failed bigint, oldest_open_at timestamptz, oldest_open_age_s double precision,
    retries_due bigint, retries_overdue bigint, stale_reserved bigint, past_deadline bigint,
    dead_letters_last_hour bigint, stripe_errors_1m bigint, stripe_errors_5m bigint,
    stripe_errors_15m bigint, stripe_errors_by_class jsonb, charges_last_minute bigint,
    max_consumer_lag bigint, workers_alive bigint, workers_silent bigint,
    breakers_not_closed bigint, projector_behind bigint, lines_unsent bigint,
    oldest_unsent_age_s double precision, lines_failing bigint, lines_past_deadline bigint,
    stripe_requests_last_hour bigint, records_last_hour bigint,
    stripe_requests_per_1000 double precision, dead_letters_total bigint,
    conflicting_duplicates_last_hour bigint
) LANGUAGE sql STABLE AS $body$
WITH s AS (SELECT * FROM billing.health_settings WHERE id = 1),
open AS (
    SELECT state, count(*) AS n, min(metered_at) AS oldest
    FROM billing.transactions
    WHERE state IN ('metered', 'reserved', 'charge_failed')
    GROUP BY state
),
stuck AS (SELECT stuck_because, count(*) AS n FROM billing.stuck_transactions_now() GROUP BY 1),
failures AS (
    SELECT error_class, at FROM billing.charge_attempts
    WHERE outcome = 'failed' AND at > now() - interval '15 minutes'
    UNION ALL
    SELECT error_class, at FROM billing.line_pushes
    WHERE outcome = 'failed' AND at > now() - interval '15 minutes'
),
errors AS (
    SELECT error_class,
           count(*) FILTER (WHERE at > now() - interval '1 minute') AS m1,
           count(*) FILTER (WHERE at > now() - interval '5 minutes') AS m5,
           count(*) AS m15
    FROM failures GROUP BY error_class
),
unsent AS (
    SELECT count(*) AS n, min(oldest_unsent_at) AS oldest,
           count(*) FILTER (WHERE push_attempts > 0) AS failing,
           count(*) FILTER (WHERE failing_since + make_interval(secs => s.retry_horizon_s)
                            < now()) AS past_deadline
    FROM billing.invoice_lines, s
    WHERE sequence > pushed_sequence OR charged_through < pushed_sequence
),
hour AS (
    SELECT (SELECT coalesce(sum(requests), 0) FROM billing.line_pushes
             WHERE at > now() - interval '1 hour') AS requests,
           (SELECT count(*) FROM billing.transactions
             WHERE metered_at > now() - interval '1 hour') AS records
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
              FROM billing.projection_positions p), 0),
    (SELECT n FROM unsent),
    coalesce(extract(epoch FROM now() - (SELECT oldest FROM unsent)), 0)::double precision,
    (SELECT failing FROM unsent),
    (SELECT past_deadline FROM unsent),
    (SELECT requests FROM hour)::bigint,
    (SELECT records FROM hour),
    CASE WHEN (SELECT records FROM hour) > 0
         THEN round(1000.0 * (SELECT requests FROM hour) / (SELECT records FROM hour), 2)
         ELSE 0 END::double precision,
    (SELECT coalesce(sum(letters), 0)::bigint FROM billing.dead_letter_counts),
    (SELECT count(*) FROM billing.dead_letters
      WHERE received_at > now() - interval '1 hour' AND reason_code = 'conflicting_duplicate')
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


def _plain(value: Any) -> Any:
    """JSON-ready: datetimes as ISO text, Decimals as numbers (via a JSON round trip)."""
    return json.loads(json.dumps(value, default=_default))


def _default(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    return float(value) if hasattr(value, "as_integer_ratio") else str(value)
