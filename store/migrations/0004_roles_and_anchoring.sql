-- Migration 4: least privilege (issue 13).
--
-- Three roles, made here when missing and granted in this database:
--
-- * billing_writer: every worker. INSERT and SELECT on the event store (never UPDATE,
--   DELETE or TRUNCATE: history and snapshots are append-only for it), DML on the
--   tables workers own (positions, dead letters, heartbeats, lag, webhook receipts,
--   health settings, and the read models the projector keeps), SELECT on the rest.
-- * billing_reader: people and dashboards. SELECT on the read models and the queue
--   health views only; never the history, the dead letters' payloads or the receipts.
-- * billing_auditor: `audit` and `export`. What the reader has, and SELECT on the
--   history, the snapshots and every table of the billing schema.
--
-- Roles are the cluster's, databases are many (one per test): creating a role is
-- idempotent and race-safe (a concurrent migrate of another database that creates it
-- first makes ours a no-op: its unique index waits for the other's commit, then
-- refuses, and the refusal is caught). The grants are this database's. `migrate`
-- checks the roles' attributes after every run (no superuser, no CREATEROLE, no
-- CREATEDB, no replication, no BYPASSRLS) and gives them the passwords its settings
-- hold (as SCRAM verifiers computed by the client).
--
-- The queue-health functions read the history (`projector_behind`) and the dead
-- letters: they run as their owner (SECURITY DEFINER, with a fixed search_path: the
-- queue-health function names the events table unqualified) so a reader sees their
-- figures without reading either.
--
-- Nothing else changes: the owner (the role that runs migrate) keeps the only DDL.
--
-- Frozen: never edit this file once released; change the schema with a new file.

DO $$
DECLARE
    r text;
BEGIN
    FOREACH r IN ARRAY ARRAY['billing_writer', 'billing_reader', 'billing_auditor'] LOOP
        IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = r) THEN
            BEGIN
                EXECUTE format(
                    'CREATE ROLE %I LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION'
                    ' NOBYPASSRLS INHERIT CONNECTION LIMIT 200', r);
            EXCEPTION WHEN duplicate_object OR unique_violation THEN
                NULL;  -- another migrate (of another database) made it first
            END;
        END IF;
    END LOOP;
END $$;

DO $$
BEGIN
    EXECUTE format('GRANT CONNECT, TEMPORARY ON DATABASE %I TO billing_writer', current_database());
    EXECUTE format('GRANT CONNECT ON DATABASE %I TO billing_reader, billing_auditor',
                   current_database());
END $$;

GRANT USAGE ON SCHEMA public, billing TO billing_writer, billing_reader, billing_auditor;

-- == The writer ======================================================================

-- INSERT of the columns a recorder writes only: `xid` and `notification_id` keep their
-- defaults, so a writer cannot place a row in the past of the log (before what the
-- followers and the anchor have read).
GRANT SELECT ON public.billingledger_events, public.billingledger_snapshots TO billing_writer;
GRANT INSERT (originator_id, originator_version, topic, state, prev_hash, hash)
    ON public.billingledger_events TO billing_writer;
GRANT INSERT ON public.billingledger_snapshots TO billing_writer;
GRANT USAGE ON SEQUENCE public.billingledger_events_notification_id_seq TO billing_writer;
GRANT SELECT, INSERT, UPDATE, DELETE ON
    billing.consumer_positions, billing.relay_position, billing.projection_positions,
    billing.dead_letters, billing.dead_letter_counts, billing.health_settings,
    billing.workers, billing.consumer_lag, billing.webhook_events, billing.webhook_counts,
    billing.transactions, billing.customer_balances, billing.charge_attempts,
    billing.invoice_lines, billing.line_pushes, billing.invoices, billing.invoice_events
    TO billing_writer;
GRANT SELECT ON billing.schema_migrations, billing.queue_health, billing.stuck_transactions
    TO billing_writer;

-- == The reader ======================================================================

GRANT SELECT ON
    billing.transactions, billing.customer_balances, billing.charge_attempts,
    billing.invoice_lines, billing.line_pushes, billing.invoices, billing.invoice_events,
    billing.queue_health, billing.stuck_transactions, billing.workers, billing.consumer_lag,
    billing.health_settings, billing.projection_positions, billing.schema_migrations
    TO billing_reader;

-- == The auditor =====================================================================

GRANT SELECT ON ALL TABLES IN SCHEMA billing TO billing_auditor;
GRANT SELECT ON public.billingledger_events, public.billingledger_snapshots TO billing_auditor;

-- == Queue health without the history ================================================

ALTER FUNCTION billing.queue_health_now() SECURITY DEFINER;
ALTER FUNCTION billing.queue_health_now() SET search_path = pg_catalog, public, pg_temp;
ALTER FUNCTION billing.stuck_transactions_now() SECURITY DEFINER;
ALTER FUNCTION billing.stuck_transactions_now() SET search_path = pg_catalog, public, pg_temp;
REVOKE EXECUTE ON FUNCTION billing.queue_health_now(), billing.stuck_transactions_now()
    FROM PUBLIC;
GRANT EXECUTE ON FUNCTION billing.queue_health_now(), billing.stuck_transactions_now()
    TO billing_writer, billing_reader, billing_auditor;
