-- Migration 15: a purchased grant voided while its invoice awaited payment.
--
-- billing.credit_purchases takes three more states (domain/purchase.py):
-- * voiding: an operator voided the grant; its invoice is being voided in Stripe (the
--   reconciler drives it, like invoicing);
-- * needs_attention: its invoice was paid after the void (the reason says what and how
--   to settle it: `billing-ledger credits reinstate`); queue health reports it;
-- * reinstated: settled by an operator, the credit bought granted again.
-- The reconciler's partial index covers voiding purchases too.
--
-- Frozen: never edit this file once released; change the schema with a new file.

ALTER TABLE billing.credit_purchases
    DROP CONSTRAINT credit_purchases_state_check,
    ADD CONSTRAINT credit_purchases_state_check
        CHECK (state IN ('requested', 'invoicing', 'finalized', 'paid', 'unpaid', 'voiding',
                         'needs_attention', 'reinstated'));

DROP INDEX billing.credit_purchases_open_idx;
CREATE INDEX credit_purchases_open_idx ON billing.credit_purchases (next_attempt_at)
    WHERE state IN ('requested', 'invoicing', 'voiding');
CREATE INDEX credit_purchases_attention_idx ON billing.credit_purchases (updated_at)
    WHERE state = 'needs_attention';
