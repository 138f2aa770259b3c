-- Migration 12: prepaid credits' read models.
--
-- * billing.credit_grants: one row per grant (customer, currency, grant id), its terms
--   and where its amount went, exactly (numeric minor units: usage consumes fractions of
--   a cent); remaining = amount - consumed - expired - voided (I11), as of the last
--   save the projector has applied.
-- * billing.credit_balances: one row per account with a grant or a credit policy: the
--   sums of its grants and its policy (block or overage).
--
-- Both are projections (projections/credits.py), rebuilt from the history like the
-- others. No event before this migration is a credit event (a build with credits waits
-- for it), so they start where the others are.
--
-- Frozen: never edit this file once released; change the schema with a new file.

CREATE TABLE billing.credit_grants (
    customer_id  text        NOT NULL,
    currency     char(3)     NOT NULL,
    grant_id     text        NOT NULL,
    amount       bigint      NOT NULL,
    priority     integer     NOT NULL,
    effective_at timestamptz NOT NULL,
    expires_at   timestamptz,
    source       text        NOT NULL,
    reason       text        NOT NULL,
    consumed     numeric     NOT NULL DEFAULT 0,
    expired      numeric     NOT NULL DEFAULT 0,
    voided       numeric     NOT NULL DEFAULT 0,
    remaining    numeric     GENERATED ALWAYS AS (amount - consumed - expired - voided) STORED,
    granted_at   timestamptz NOT NULL,
    updated_at   timestamptz NOT NULL,
    CONSTRAINT credit_grants_pkey PRIMARY KEY (customer_id, currency, grant_id)
);

CREATE TABLE billing.credit_balances (
    customer_id text        NOT NULL,
    currency    char(3)     NOT NULL,
    policy      text        NOT NULL DEFAULT 'overage',
    grants      integer     NOT NULL DEFAULT 0,
    granted     bigint      NOT NULL DEFAULT 0,
    consumed    numeric     NOT NULL DEFAULT 0,
    expired     numeric     NOT NULL DEFAULT 0,
    voided      numeric     NOT NULL DEFAULT 0,
    remaining   numeric     GENERATED ALWAYS AS (granted - consumed - expired - voided) STORED,
    updated_at  timestamptz NOT NULL,
    CONSTRAINT credit_balances_pkey PRIMARY KEY (customer_id, currency)
);

INSERT INTO billing.projection_positions (name, xid, notification_id)
SELECT v.name, p.xid, p.notification_id
FROM (VALUES ('credit_grants'), ('credit_balances')) v(name),
     (SELECT xid, notification_id FROM billing.projection_positions
      ORDER BY xid, notification_id LIMIT 1) p
ON CONFLICT (name) DO NOTHING;
INSERT INTO billing.projection_positions VALUES ('credit_grants', '0', 0),
    ('credit_balances', '0', 0)
ON CONFLICT (name) DO NOTHING;

GRANT SELECT, INSERT, UPDATE, DELETE ON billing.credit_grants, billing.credit_balances
    TO billing_writer;
GRANT SELECT ON billing.credit_grants, billing.credit_balances
    TO billing_reader, billing_auditor;
