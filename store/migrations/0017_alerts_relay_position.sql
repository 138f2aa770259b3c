-- Migration 17: spend alert crossings are published by a relay of their own.
--
-- Until now the relay of billing.events published each alert crossing to billing.alerts
-- with the events; the alerts relay (adapters/alerts/relay.py) now follows the log on a
-- position of its own, named 'alerts'. It starts where the events relay stood when this
-- ran: every crossing before that position is on the alerts topic already. A relay of
-- the build before, still running after this, publishes a few crossings again (at least
-- once, as always: a receiver deduplicates by the alert's id). On a new database there
-- is no position to take, and the alerts relay starts at the beginning of the log.
--
-- Frozen: never edit this file once released; change the schema with a new file.

INSERT INTO billing.relay_position (name, xid, notification_id)
SELECT 'alerts', xid, notification_id FROM billing.relay_position
WHERE name = 'billing.events'
ON CONFLICT (name) DO NOTHING;
