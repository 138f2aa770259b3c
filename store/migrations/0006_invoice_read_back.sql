-- Migration 6: what reading Stripe back finds, on the invoices' read model.
--
-- Before an invoice is finalized its draft is read back from Stripe and compared with
-- the ledger (domain/verification.py). The invoices' row now shows what an operator
-- must act on: `attention` (why the invoice is stopped, or why its finalized total
-- differs from the ledger; NULL when nothing is wrong), `repairs` (how many times a
-- drifted draft was set back to the ledger's amounts) and `stripe_mismatch_total`
-- (Stripe's finalized total when it differs from `expected_total`) and `checked_at`
-- (when its open draft was last read back: the reconciler checks, within a share of
-- the Stripe rate, the drafts whose lines were pushed since, oldest first). Queue
-- health reports every invoice with an `attention`.
--
-- Frozen: never edit this file once released; change the schema with a new file.

ALTER TABLE billing.invoices
    ADD COLUMN attention             text,
    ADD COLUMN repairs               integer NOT NULL DEFAULT 0,
    ADD COLUMN stripe_mismatch_total bigint,
    ADD COLUMN checked_at            timestamptz;

CREATE INDEX invoices_attention_idx ON billing.invoices (invoice_id) WHERE attention IS NOT NULL;
