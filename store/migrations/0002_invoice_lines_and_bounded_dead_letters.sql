-- Migration 2: invoice lines (issue 10) and bounded dead letters (issue 11).
--
-- * Amounts in the read models become exact: billing.transactions.amount and the sums
--   of billing.customer_balances are numeric (minor units, never rounded; a bigint of
--   an older history converts exactly), and a transaction names its invoice line.
--   Both tables are remade in their new shape, column order included, and their rows
--   copied as they are: no transaction of a history from before lines has a line. The
--   projector keeps its position (nothing needs projecting again).
-- * Two new read models, billing.invoice_lines and billing.line_pushes, start empty
--   where the other read models are: a history from before lines has no line events.
-- * A dead letter keeps a prefix of its payload with the whole one's size and hash, and
--   its reason's code; billing.dead_letter_counts counts letters per hour, source topic
--   and code, and outlives the rows that retention removes. Letters stored before are
--   counted here, once.
-- * The queue-health functions gain the lines' and the dead letters' columns (a
--   function's columns cannot change in place: the views and functions are remade).
--
-- Locks: the two remade read models are locked for the copy (the projector waits; the
-- queue-health views wait for the duration); dead_letters for the added columns (no
-- rewrite: they are nullable without a default). The events table is not touched.
--
-- Frozen: never edit this file once released; change the schema with a new file.

LOCK TABLE billing.transactions, billing.customer_balances IN ACCESS EXCLUSIVE MODE;

-- The views first: they depend on the functions whose columns change.
DROP VIEW billing.queue_health;
DROP FUNCTION billing.queue_health_now();
DROP VIEW billing.stuck_transactions;
DROP FUNCTION billing.stuck_transactions_now();

-- == billing.transactions: exact amounts, and the line a transaction joined ==========

-- Copied aside and dropped first, so that every name the new table's constraints and
-- indexes get is the one a database made from scratch has.
CREATE TEMP TABLE transactions_0001 ON COMMIT DROP AS SELECT * FROM billing.transactions;
DROP TABLE billing.transactions;

CREATE TABLE billing.transactions (
    transaction_id      uuid        NOT NULL,
    customer_id         text        NOT NULL,
    usage_id            text        NOT NULL,
    meter               text        NOT NULL,
    quantity            numeric     NOT NULL,
    amount              numeric     NOT NULL,
    currency            char(3)     NOT NULL,
    state               text        NOT NULL CHECK (state IN ('metered', 'reserved',
                                    'charge_failed', 'charged', 'compensated')),
    line_id             uuid,
    line_sequence       integer,
    attempts            integer     NOT NULL DEFAULT 0,
    last_error          text,
    next_attempt_at     timestamptz,
    stripe_object_id    text,
    compensation_reason text,
    occurred_at         timestamptz NOT NULL,
    metered_at          timestamptz NOT NULL,
    reserved_at         timestamptz,
    charged_at          timestamptz,
    compensated_at      timestamptz,
    updated_at          timestamptz NOT NULL,
    CONSTRAINT transactions_pkey PRIMARY KEY (transaction_id)
);
INSERT INTO billing.transactions (
    transaction_id, customer_id, usage_id, meter, quantity, amount, currency, state,
    attempts, last_error, next_attempt_at, stripe_object_id, compensation_reason,
    occurred_at, metered_at, reserved_at, charged_at, compensated_at, updated_at)
SELECT transaction_id, customer_id, usage_id, meter, quantity, amount, currency, state,
       attempts, last_error, next_attempt_at, stripe_object_id, compensation_reason,
       occurred_at, metered_at, reserved_at, charged_at, compensated_at, updated_at
FROM pg_temp.transactions_0001;
CREATE INDEX transactions_customer_idx ON billing.transactions (customer_id, metered_at);
CREATE INDEX transactions_state_due_idx ON billing.transactions (state, next_attempt_at);

-- == billing.customer_balances: exact sums ==========================================

CREATE TEMP TABLE customer_balances_0001 ON COMMIT DROP AS
SELECT * FROM billing.customer_balances;
DROP TABLE billing.customer_balances;

CREATE TABLE billing.customer_balances (
    customer_id  text    NOT NULL,
    currency     char(3) NOT NULL,
    metered      numeric NOT NULL DEFAULT 0,
    charged      numeric NOT NULL DEFAULT 0,
    compensated  numeric NOT NULL DEFAULT 0,
    in_flight    numeric GENERATED ALWAYS AS (metered - charged - compensated) STORED,
    transactions integer NOT NULL DEFAULT 0,
    refused      integer NOT NULL DEFAULT 0,
    spend_limit  numeric,
    available    numeric GENERATED ALWAYS AS (CASE WHEN spend_limit IS NULL THEN NULL
        ELSE GREATEST(spend_limit - (metered - compensated), 0) END) STORED,
    updated_at   timestamptz NOT NULL,
    CONSTRAINT customer_balances_pkey PRIMARY KEY (customer_id, currency)
);
INSERT INTO billing.customer_balances (
    customer_id, currency, metered, charged, compensated, transactions, refused,
    spend_limit, updated_at)
SELECT customer_id, currency, metered, charged, compensated, transactions, refused,
       spend_limit, updated_at
FROM pg_temp.customer_balances_0001;

-- == billing.invoice_lines and billing.line_pushes: new read models ==================

CREATE TABLE billing.invoice_lines (
    line_id           uuid        NOT NULL,
    customer_id       text        NOT NULL,
    currency          char(3)     NOT NULL,
    meter             text        NOT NULL,
    period_start      timestamptz NOT NULL,
    period_end        timestamptz NOT NULL,
    exact_total       numeric     NOT NULL,
    billed            bigint      NOT NULL,
    transactions      integer     NOT NULL,
    sequence          integer     NOT NULL,
    pushed_sequence   integer     NOT NULL,
    stripe_amount     bigint      NOT NULL,
    stripe_item_ids   text[]      NOT NULL,
    stripe_invoice_id text,
    charged_through   integer     NOT NULL,
    push_attempts     integer     NOT NULL,
    last_error        text,
    next_attempt_at   timestamptz,
    failing_since     timestamptz,
    last_push_at      timestamptz,
    oldest_unsent_at  timestamptz,
    stripe_requests   bigint      NOT NULL,
    updated_at        timestamptz NOT NULL,
    CONSTRAINT invoice_lines_pkey PRIMARY KEY (line_id)
);
CREATE INDEX invoice_lines_customer_idx ON billing.invoice_lines (customer_id, period_start);
CREATE INDEX invoice_lines_unsent_idx ON billing.invoice_lines (oldest_unsent_at)
    WHERE sequence > pushed_sequence OR charged_through < pushed_sequence;

CREATE TABLE billing.line_pushes (
    push_id     uuid        NOT NULL,
    version     integer     NOT NULL,
    line_id     uuid        NOT NULL,
    customer_id text        NOT NULL,
    at          timestamptz NOT NULL,
    outcome     text        NOT NULL CHECK (outcome IN ('pushed', 'failed')),
    sequence    integer     NOT NULL,
    billed      bigint,
    error_class text,
    retryable   boolean,
    requests    integer     NOT NULL,
    CONSTRAINT line_pushes_pkey PRIMARY KEY (push_id, version)
);
CREATE INDEX line_pushes_at_idx ON billing.line_pushes (at);

-- No event before this migration is a line's (a build with lines waits for it), so the
-- new read models start where the slowest of the others is, not at the start of a log
-- that may hold millions of events that concern neither.
INSERT INTO billing.projection_positions (name, xid, notification_id)
SELECT v.name, p.xid, p.notification_id
FROM (VALUES ('invoice_lines'), ('line_pushes')) v(name),
     (SELECT xid, notification_id FROM billing.projection_positions
      WHERE name IN ('transactions', 'customer_balances', 'charge_attempts')
      ORDER BY xid, notification_id LIMIT 1) p
ON CONFLICT (name) DO NOTHING;
INSERT INTO billing.projection_positions VALUES ('invoice_lines', '0', 0), ('line_pushes', '0', 0)
ON CONFLICT (name) DO NOTHING;

-- == Bounded dead letters ===========================================================

ALTER TABLE billing.dead_letters
    ADD COLUMN reason_code    text,
    ADD COLUMN payload_size   integer,
    ADD COLUMN payload_sha256 bytea;
CREATE TABLE billing.dead_letter_counts (
    hour         timestamptz NOT NULL,
    source_topic text        NOT NULL,
    reason_code  text        NOT NULL,
    letters      bigint      NOT NULL CHECK (letters > 0),
    PRIMARY KEY (hour, source_topic, reason_code)
);
-- The letters stored before the counts existed, counted once.
INSERT INTO billing.dead_letter_counts (hour, source_topic, reason_code, letters)
SELECT date_trunc('hour', received_at), source_topic, 'invalid', count(*)
FROM billing.dead_letters
GROUP BY 1, 2;

-- == Queue health: the lines' and the dead letters' columns ==========================

CREATE FUNCTION billing.stuck_transactions_now() RETURNS TABLE (
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
CREATE VIEW billing.stuck_transactions AS
SELECT * FROM billing.stuck_transactions_now();

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
CREATE VIEW billing.queue_health AS SELECT * FROM billing.queue_health_now();
