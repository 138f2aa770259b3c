-- Migration 9: outgoing alert webhooks.
--
-- `billing.webhook_endpoints`: where spend alerts are sent (`billing-ledger webhooks add`),
-- which event types each endpoint wants, and its signing secret (shown once when the
-- endpoint is added; the writer signs with it, so readers are not granted the column).
-- An endpoint removed is kept (`removed_at`) so its deliveries still name it.
--
-- `billing.webhook_deliveries`: one row per endpoint and alert (the pair is unique, so a
-- redelivered alert adds nothing), with the exact body sent, the attempts, the status
-- (pending, delivered, failed: given up after the retry horizon), the last error and
-- HTTP status, and when it is next due; retries stop (failed) once the retry horizon
-- has passed since `retry_from` (its creation, or the last replay). `version` is the claim: a worker takes a
-- delivery by a conditional UPDATE of its version and due time, and records the outcome
-- only while the version is still the one it claimed; no row is locked across a call.
--
-- Frozen: never edit this file once released; change the schema with a new file.

CREATE TABLE billing.webhook_endpoints (
    endpoint_id uuid PRIMARY KEY,
    url text NOT NULL CHECK (length(url) <= 2048),
    events text[] NOT NULL,
    secret text NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    removed_at timestamptz
);

CREATE TABLE billing.webhook_deliveries (
    delivery_id uuid PRIMARY KEY,
    endpoint_id uuid NOT NULL REFERENCES billing.webhook_endpoints (endpoint_id),
    event_id uuid NOT NULL,
    event_type text NOT NULL,
    payload bytea NOT NULL,
    status text NOT NULL DEFAULT 'pending'
        CHECK (status IN ('pending', 'delivered', 'failed')),
    attempts integer NOT NULL DEFAULT 0,
    version integer NOT NULL DEFAULT 0,
    next_try_at timestamptz NOT NULL DEFAULT now(),
    last_status integer,
    last_error text,
    created_at timestamptz NOT NULL DEFAULT now(),
    retry_from timestamptz NOT NULL DEFAULT now(),
    delivered_at timestamptz,
    UNIQUE (endpoint_id, event_id)
);

CREATE INDEX webhook_deliveries_due ON billing.webhook_deliveries (next_try_at)
    WHERE status = 'pending';
CREATE INDEX webhook_deliveries_event ON billing.webhook_deliveries (event_id);

GRANT SELECT, INSERT, UPDATE ON billing.webhook_endpoints, billing.webhook_deliveries
    TO billing_writer;
GRANT SELECT (endpoint_id, url, events, created_at, removed_at)
    ON billing.webhook_endpoints TO billing_reader, billing_auditor;
GRANT SELECT ON billing.webhook_deliveries TO billing_reader, billing_auditor;
