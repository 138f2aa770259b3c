-- Migration 7: dead letters can be re-driven, once.
--
-- `billing-ledger dead-letters redrive` puts a letter's original bytes back on the usage
-- topic (after a fix of the prices or of the producer), with a header naming the letter;
-- `redriven_at` records that it was sent, so a second redrive sends nothing new. The
-- record then goes through the normal path and is deduplicated there as any other.
--
-- Frozen: never edit this file once released; change the schema with a new file.

ALTER TABLE billing.dead_letters ADD COLUMN redriven_at timestamptz;
