-- Migration 3: invoices closed, finalized and paid (issue 12).
--
-- * billing.invoices: one row per invoice, its state and Stripe's figures (a read
--   model: the projector writes it); billing.invoice_events: one row per payment
--   failure, payment, void, credit (queue health counts failures in 24 h from it).
-- * billing.invoice_lines gains `frozen` (its invoice closed) and `late_of_start` (a
--   late line: usage of that earlier period that arrived after its invoice closed).
-- * billing.webhook_events: every Stripe event id received, written in the same
--   database transaction as its effect (a redelivery finds it and does nothing);
--   billing.webhook_counts: requests per hour and outcome (bad signatures included,
--   which record nothing else).
-- * billing.health_settings gains invoice_grace_s (the close deadline is the period's
--   end plus it).
-- * Queue health gains the invoices' and the webhooks' columns.
--
-- No event before this migration is an invoice's lifecycle (a build with invoices
-- waits for it), so the new read models start where the others are.
--
-- Frozen: never edit this file once released; change the schema with a new file.

DROP VIEW billing.queue_health;
DROP FUNCTION billing.queue_health_now();

CREATE TABLE billing.invoices (
    invoice_id         uuid        NOT NULL,
    customer_id        text        NOT NULL,
    currency           char(3)     NOT NULL,
    period_start       timestamptz NOT NULL,
    period_end         timestamptz NOT NULL,
    state              text        NOT NULL,
    lines              integer     NOT NULL,
    stripe_invoice_id  text,
    stripe_customer_id text,
    number             text,
    expected_total     bigint      NOT NULL,
    total              bigint      NOT NULL,
    amount_paid        bigint      NOT NULL,
    credited           bigint      NOT NULL,
    credits_pending    integer     NOT NULL,
    payment_attempts   integer     NOT NULL,
    finalize_attempts  integer     NOT NULL,
    last_error         text,
    next_attempt_at    timestamptz,
    closed_at          timestamptz,
    finalized_at       timestamptz,
    paid_at            timestamptz,
    updated_at         timestamptz NOT NULL,
    CONSTRAINT invoices_pkey PRIMARY KEY (invoice_id)
);
CREATE INDEX invoices_customer_idx ON billing.invoices (customer_id, period_start);
CREATE INDEX invoices_state_idx ON billing.invoices (state, period_end);
CREATE INDEX invoices_stripe_idx ON billing.invoices (stripe_invoice_id);

CREATE TABLE billing.invoice_events (
    invoice_id  uuid        NOT NULL,
    version     integer     NOT NULL,
    customer_id text        NOT NULL,
    kind        text        NOT NULL,
    at          timestamptz NOT NULL,
    amount      bigint,
    detail      text,
    CONSTRAINT invoice_events_pkey PRIMARY KEY (invoice_id, version)
);
CREATE INDEX invoice_events_at_idx ON billing.invoice_events (at);

INSERT INTO billing.projection_positions (name, xid, notification_id)
SELECT v.name, p.xid, p.notification_id
FROM (VALUES ('invoices'), ('invoice_events')) v(name),
     (SELECT xid, notification_id FROM billing.projection_positions
      ORDER BY xid, notification_id LIMIT 1) p
ON CONFLICT (name) DO NOTHING;
INSERT INTO billing.projection_positions VALUES ('invoices', '0', 0), ('invoice_events', '0', 0)
ON CONFLICT (name) DO NOTHING;

ALTER TABLE billing.invoice_lines
    ADD COLUMN frozen        boolean NOT NULL DEFAULT false,
    ADD COLUMN late_of_start timestamptz;

CREATE TABLE billing.webhook_events (
    event_id    text        NOT NULL,
    type        text        NOT NULL,
    invoice_id  uuid,
    outcome     text        NOT NULL,
    created_at  timestamptz,
    received_at timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT webhook_events_pkey PRIMARY KEY (event_id)
);
CREATE INDEX webhook_events_received_at_idx ON billing.webhook_events (received_at);

CREATE TABLE billing.webhook_counts (
    hour     timestamptz NOT NULL,
    outcome  text        NOT NULL,
    requests bigint      NOT NULL CHECK (requests > 0),
    PRIMARY KEY (hour, outcome)
);

ALTER TABLE billing.health_settings
    ADD COLUMN invoice_grace_s double precision NOT NULL DEFAULT 3600;

CREATE FUNCTION billing.queue_health_now() RETURNS TABLE (
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
    conflicting_duplicates_last_hour bigint, invoices_closing bigint,
    invoices_past_deadline bigint, payment_failures_24h bigint,
    credits_pending bigint, last_webhook_at timestamptz,
    webhook_signature_failures_1h bigint
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
closing AS (
    SELECT count(*) FILTER (WHERE i.period_end + make_interval(secs => s.invoice_grace_s)
                            <= now()) AS due,
           count(*) FILTER (WHERE i.period_end + make_interval(
                                secs => s.invoice_grace_s + s.retry_horizon_s) < now()) AS late
    FROM billing.invoices i, s
    WHERE i.state IN ('open', 'closed', 'finalizing')
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
      WHERE received_at > now() - interval '1 hour' AND reason_code = 'conflicting_duplicate'),
    (SELECT due FROM closing),
    (SELECT late FROM closing),
    (SELECT count(*) FROM billing.invoice_events
      WHERE kind = 'payment_failed' AND at > now() - interval '24 hours'),
    (SELECT coalesce(sum(credits_pending), 0)::bigint FROM billing.invoices),
    (SELECT max(received_at) FROM billing.webhook_events),
    (SELECT coalesce(sum(requests), 0)::bigint FROM billing.webhook_counts
      WHERE outcome = 'bad_signature' AND hour > now() - interval '1 hour')
$body$;
CREATE VIEW billing.queue_health AS SELECT * FROM billing.queue_health_now();
