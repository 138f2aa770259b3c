-- Migration 16: an account's credit balance is written in the save that moves it.
--
-- billing.credit_balances gains account_version: the version of the account's last
-- credit event the row holds. A save of an account with a credit event writes the
-- account's row in its own transaction (store/credit_rows.py), only over an older one;
-- the projector skips an event at or below it (projections/credits.py), so each event
-- is counted once whichever writes first. Rows from before hold 0: the next save writes
-- the account's whole state over them, and the projector's events after its position
-- are newer than 0, as they were always applied.
--
-- Frozen: never edit this file once released; change the schema with a new file.

ALTER TABLE billing.credit_balances ADD COLUMN account_version bigint NOT NULL DEFAULT 0;
