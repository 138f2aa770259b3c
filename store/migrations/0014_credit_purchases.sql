-- Migration 14: purchased credit and automatic top-ups.
--
-- * billing.credit_grants gains each grant's state: live (usable between its moments),
--   pending (purchased, its invoice not paid yet: not consumable) or unpaid (purchased,
--   its invoice void, uncollectible or refused: voided, never live), and why
--   (state_reason). Every grant before this migration is live.
-- * billing.credit_purchases: one row per purchase of credit (a purchased grant's
--   one-off invoice, domain/purchase.py), from the automatic top-up that requested it
--   (state requested) through its invoice (invoicing, finalized) to paid or unpaid.
--   The reconciler reads it to start the top-ups requested and to drive the invoices
--   that are due.
--
-- Both are projections (projections/credits.py, projections/purchases.py), rebuilt from
-- the history. No event before this migration is a purchase event, so the new one starts
-- where the others are.
--
-- Frozen: never edit this file once released; change the schema with a new file.

ALTER TABLE billing.credit_grants
    ADD COLUMN state        text NOT NULL DEFAULT 'live'
        CONSTRAINT credit_grants_state_check CHECK (state IN ('live', 'pending', 'unpaid')),
    ADD COLUMN state_reason text NOT NULL DEFAULT '';

CREATE TABLE billing.credit_purchases (
    purchase_id       uuid        NOT NULL,
    customer_id       text        NOT NULL,
    currency          char(3)     NOT NULL,
    grant_id          text        NOT NULL,
    amount            bigint      NOT NULL,
    price             bigint      NOT NULL,
    top_up            boolean     NOT NULL,
    state             text        NOT NULL,
    stripe_invoice_id text,
    attempts          integer     NOT NULL DEFAULT 0,
    next_attempt_at   timestamptz,
    reason            text        NOT NULL DEFAULT '',
    requested_at      timestamptz NOT NULL,
    updated_at        timestamptz NOT NULL,
    CONSTRAINT credit_purchases_pkey PRIMARY KEY (purchase_id),
    CONSTRAINT credit_purchases_state_check
        CHECK (state IN ('requested', 'invoicing', 'finalized', 'paid', 'unpaid'))
);
CREATE INDEX credit_purchases_open_idx ON billing.credit_purchases (next_attempt_at)
    WHERE state IN ('requested', 'invoicing');

INSERT INTO billing.projection_positions (name, xid, notification_id)
SELECT 'credit_purchases', p.xid, p.notification_id
FROM (SELECT xid, notification_id FROM billing.projection_positions
      ORDER BY xid, notification_id LIMIT 1) p
ON CONFLICT (name) DO NOTHING;
INSERT INTO billing.projection_positions VALUES ('credit_purchases', '0', 0)
ON CONFLICT (name) DO NOTHING;

GRANT SELECT, INSERT, UPDATE, DELETE ON billing.credit_purchases TO billing_writer;
GRANT SELECT ON billing.credit_purchases TO billing_reader, billing_auditor;
