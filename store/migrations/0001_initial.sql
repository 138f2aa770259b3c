-- Migration 1: the whole schema as `prepare()` made it at every process start before
-- migrations existed (commit 56a5b80), so a database that an earlier version prepared
-- is adopted as it is: every statement is IF NOT EXISTS or CREATE OR REPLACE, and the
-- ones on tables that workers write look in the catalog first, so adopting a running
-- fleet's database takes no lock that would stop its writes (ALTER TABLE ... ADD COLUMN
-- IF NOT EXISTS and CREATE INDEX IF NOT EXISTS lock the table even when there is
-- nothing to do).
--
-- Frozen: never edit this file once released (`migrate` refuses a changed checksum);
-- change the schema with a new numbered file.

CREATE SCHEMA IF NOT EXISTS billing;

-- == The event store ================================================================
-- eventsourcing 9.5's tables for the application BillingLedger (its
-- PostgresApplicationRecorder and PostgresAggregateRecorder DDL, written out here so a
-- library upgrade cannot change the schema behind the migrations), plus what
-- store.recorder.LedgerRecorder adds: the writing transaction's id (the gap-free
-- reader's order), the hash chain, and the trigger that keeps history append-only.

CREATE TABLE IF NOT EXISTS public.billingledger_events (
    originator_id uuid NOT NULL,
    originator_version bigint NOT NULL,
    topic text,
    state bytea,
    notification_id bigserial,
    xid xid8 NOT NULL DEFAULT pg_current_xact_id(),
    prev_hash bytea,
    hash bytea,
    PRIMARY KEY (originator_id, originator_version)
) WITH (
    autovacuum_enabled = true,
    autovacuum_vacuum_threshold = 100000000,
    autovacuum_vacuum_scale_factor = 0.5,
    autovacuum_analyze_threshold = 1000,
    autovacuum_analyze_scale_factor = 0.01
);

-- A table made by eventsourcing alone, or by a version before the hash chain.
DO $$
BEGIN
    IF NOT EXISTS (SELECT FROM pg_attribute WHERE attname = 'xid' AND NOT attisdropped
                   AND attrelid = 'public.billingledger_events'::regclass) THEN
        ALTER TABLE public.billingledger_events
            ADD COLUMN xid xid8 NOT NULL DEFAULT pg_current_xact_id();
    END IF;
    IF NOT EXISTS (SELECT FROM pg_attribute WHERE attname = 'prev_hash' AND NOT attisdropped
                   AND attrelid = 'public.billingledger_events'::regclass) THEN
        ALTER TABLE public.billingledger_events ADD COLUMN prev_hash bytea;
    END IF;
    IF NOT EXISTS (SELECT FROM pg_attribute WHERE attname = 'hash' AND NOT attisdropped
                   AND attrelid = 'public.billingledger_events'::regclass) THEN
        ALTER TABLE public.billingledger_events ADD COLUMN hash bytea;
    END IF;
END $$;

CREATE TABLE IF NOT EXISTS public.billingledger_snapshots (
    originator_id uuid NOT NULL,
    originator_version bigint NOT NULL,
    topic text,
    state bytea,
    PRIMARY KEY (originator_id, originator_version)
) WITH (
    autovacuum_enabled = true,
    autovacuum_vacuum_threshold = 100000000,
    autovacuum_vacuum_scale_factor = 0.5,
    autovacuum_analyze_threshold = 1000,
    autovacuum_analyze_scale_factor = 0.01
);

-- eventsourcing's composite type and insert function. The ledger's recorder uses
-- neither (it inserts without a table lock or NOTIFY); they are kept so that a
-- database made here and one an earlier version prepared are the same.
DO $$
BEGIN
    CREATE TYPE public.stored_event_uuid AS (
        originator_id uuid,
        originator_version bigint,
        topic text,
        state bytea
    );
EXCEPTION WHEN duplicate_object THEN NULL;
END $$;

CREATE OR REPLACE FUNCTION public.es_insert_events_uuid(events public.stored_event_uuid[])
RETURNS SETOF bigint LANGUAGE plpgsql AS $BODY$BEGIN    SET LOCAL lock_timeout = '0s';    NOTIFY "billingledger_events";    RETURN QUERY    INSERT INTO "public"."billingledger_events" AS t (    originator_id, originator_version, topic, state)    SELECT originator_id, originator_version, topic, state    FROM unnest(events)    RETURNING notification_id;END;$BODY$;

CREATE OR REPLACE FUNCTION public.billing_events_append_only() RETURNS trigger
LANGUAGE plpgsql AS $$BEGIN RAISE EXCEPTION 'billing-ledger events are append-only (% refused on %)', TG_OP, TG_TABLE_NAME; END$$;

DO $$
BEGIN
    IF NOT EXISTS (SELECT FROM pg_trigger WHERE tgname = 'events_append_only'
                   AND tgrelid = 'public.billingledger_events'::regclass) THEN
        CREATE TRIGGER events_append_only
            BEFORE UPDATE OR DELETE OR TRUNCATE ON public.billingledger_events
            FOR EACH STATEMENT EXECUTE FUNCTION public.billing_events_append_only();
    END IF;
END $$;

-- == Positions, and the tables workers write that nothing rebuilds ===================

CREATE TABLE IF NOT EXISTS billing.consumer_positions (
    group_name  text    NOT NULL,
    topic       text    NOT NULL,
    partition   integer NOT NULL,
    next_offset bigint  NOT NULL,
    PRIMARY KEY (group_name, topic, partition)
);
CREATE TABLE IF NOT EXISTS billing.relay_position (
    name            text PRIMARY KEY,
    xid             xid8   NOT NULL,
    notification_id bigint NOT NULL
);
CREATE TABLE IF NOT EXISTS billing.projection_positions (
    name            text   PRIMARY KEY,
    xid             xid8   NOT NULL,
    notification_id bigint NOT NULL
);
CREATE TABLE IF NOT EXISTS billing.dead_letters (
    source_topic     text        NOT NULL,
    source_partition integer     NOT NULL,
    source_offset    bigint      NOT NULL,
    record_key       bytea,
    payload          bytea,
    reason           text        NOT NULL CHECK (reason <> ''),
    received_at      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (source_topic, source_partition, source_offset)
);
-- The deadlines billing.queue_health judges by: one row, written by each worker at
-- start from its settings (last writer wins); these are the settings' defaults.
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

-- == The read models (projections/): their tables and positions =====================
-- `rebuild` makes its shadow table LIKE the live one, so these statements (and the
-- migrations after them) are the only definition of a read model's shape.

CREATE TABLE IF NOT EXISTS billing.transactions (
    transaction_id      uuid        NOT NULL,
    customer_id         text        NOT NULL,
    usage_id            text        NOT NULL,
    meter               text        NOT NULL,
    quantity            numeric     NOT NULL,
    amount              bigint      NOT NULL,
    currency            char(3)     NOT NULL,
    state               text        NOT NULL CHECK (state IN ('metered', 'reserved', 'charge_failed', 'charged', 'compensated')),
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
CREATE TABLE IF NOT EXISTS billing.customer_balances (
    customer_id  text    NOT NULL,
    currency     char(3) NOT NULL,
    metered      bigint  NOT NULL DEFAULT 0,
    charged      bigint  NOT NULL DEFAULT 0,
    compensated  bigint  NOT NULL DEFAULT 0,
    in_flight    bigint  GENERATED ALWAYS AS (metered - charged - compensated) STORED,
    transactions integer NOT NULL DEFAULT 0,
    refused      integer NOT NULL DEFAULT 0,
    spend_limit  bigint,
    available    bigint  GENERATED ALWAYS AS (CASE WHEN spend_limit IS NULL THEN NULL
        ELSE GREATEST(spend_limit - (metered - compensated), 0) END) STORED,
    updated_at   timestamptz NOT NULL,
    CONSTRAINT customer_balances_pkey PRIMARY KEY (customer_id, currency)
);
CREATE TABLE IF NOT EXISTS billing.charge_attempts (
    transaction_id        uuid        NOT NULL,
    version               integer     NOT NULL,
    customer_id           text        NOT NULL,
    at                    timestamptz NOT NULL,
    outcome               text        NOT NULL CHECK (outcome IN ('charged', 'failed')),
    error_class           text,
    retryable             boolean,
    seconds_since_metered double precision,
    CONSTRAINT charge_attempts_pkey PRIMARY KEY (transaction_id, version)
);
INSERT INTO billing.projection_positions VALUES
    ('transactions', '0', 0), ('customer_balances', '0', 0), ('charge_attempts', '0', 0)
ON CONFLICT (name) DO NOTHING;

-- == Indexes on tables that workers write: made only when missing ====================

DO $$
BEGIN
    IF to_regclass('public.billingledger_events_notification_id_idx') IS NULL THEN
        CREATE UNIQUE INDEX billingledger_events_notification_id_idx
            ON public.billingledger_events (notification_id ASC);
    END IF;
    IF to_regclass('public.billingledger_events_xid_idx') IS NULL THEN
        CREATE INDEX billingledger_events_xid_idx
            ON public.billingledger_events (xid, notification_id);
    END IF;
    IF to_regclass('billing.dead_letters_received_at_idx') IS NULL THEN
        CREATE INDEX dead_letters_received_at_idx ON billing.dead_letters (received_at);
    END IF;
    IF to_regclass('billing.transactions_customer_idx') IS NULL THEN
        CREATE INDEX transactions_customer_idx ON billing.transactions (customer_id, metered_at);
    END IF;
    IF to_regclass('billing.transactions_state_due_idx') IS NULL THEN
        CREATE INDEX transactions_state_due_idx ON billing.transactions (state, next_attempt_at);
    END IF;
    IF to_regclass('billing.charge_attempts_at_idx') IS NULL THEN
        CREATE INDEX charge_attempts_at_idx ON billing.charge_attempts (at);
    END IF;
END $$;

-- == Queue health (projections/queue_health.py reads these) ==========================
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
