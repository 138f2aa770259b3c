-- Migration 11: re-pricing recorded usage.
--
-- A price book version published for a moment in the past prices again the usage it
-- covers on lines that are still open (`domain.repricing`). The reconciler finds that
-- usage in SQL: each transaction's price book version (`price_version`, the version its
-- Metered names, or its newest Repriced), and the transactions of a line by its id.
-- Transactions recorded before price books name the initial version, 1, as their
-- Metered event loads (its upcaster). A projection rebuild gives the same values.
--
-- Frozen: never edit this file once released; change the schema with a new file.

ALTER TABLE billing.transactions ADD COLUMN price_version integer;

UPDATE billing.transactions t
   SET price_version = coalesce(
       (convert_from(e.state, 'UTF8')::jsonb ->> 'price_version')::integer, 1)
  FROM public.billingledger_events e
 WHERE e.originator_id = t.transaction_id AND e.originator_version = 1;

CREATE INDEX transactions_line_idx ON billing.transactions (line_id);
