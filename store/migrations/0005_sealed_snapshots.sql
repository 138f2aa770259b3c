-- Migration 5: sealed snapshots (issue 13).
--
-- A snapshot is only a cache of an aggregate's state at one version, but a forged one
-- was trusted on load (a customer's spend limit lifted by an inserted snapshot). Each
-- snapshot now carries a seal: SHA-256 over its content and the hash of the event it
-- was taken at (`domain.chain.snapshot_seal`). The ledger uses a snapshot only when
-- its seal matches that stored event's hash (`store.snapshots`); any other (forged,
-- edited, or taken before this migration: no seal) is passed over and the aggregate
-- is rebuilt from its events. The writer's INSERT grant on the table covers the new
-- column; it still has no UPDATE or DELETE there.
--
-- Frozen: never edit this file once released; change the schema with a new file.

ALTER TABLE public.billingledger_snapshots ADD COLUMN IF NOT EXISTS seal bytea;
