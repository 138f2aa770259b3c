"""The database's layout and the broker's topics: every name the code uses.

Every table, view and topic the ledger uses is named here, so a reader finds them in
one place and no module spells a name of its own. The DDL that makes them is not
here: the schema changes only by the numbered migrations of ``store.migrations``
(``0001_initial.sql``, ...), run once by ``billing-ledger migrate``, never by a
worker; a migration is frozen history, so it spells the names as they were when it
was written (a test checks that every name here exists after ``migrate``).

Besides the read models (``projections/``), the ``billing`` schema holds:

* positions: how far each follower has read (``relay_position``,
  ``projection_positions``, ``consumer_positions``);
* stores that workers write and nothing rebuilds: ``dead_letters`` (and its
  ``dead_letter_counts``), ``workers``, ``consumer_lag``;
* ``health_settings``: the deadlines ``billing.queue_health`` judges by;
* the alert webhooks (``adapters.alerts``): ``webhook_endpoints`` (where to send, and
  each endpoint's signing secret) and ``webhook_deliveries`` (one row per endpoint and
  alert: attempts, status, last error, next try);
* ``schema_migrations``: which migrations the database has applied.

The events and snapshots tables have eventsourcing's layout (named after the
application), plus the columns and the append-only trigger ``LedgerRecorder`` needs.
"""

from __future__ import annotations

__all__ = [
    "CONSUMER_LAG",
    "CONSUMER_POSITIONS",
    "CREDIT_BALANCES",
    "DEAD_LETTERS",
    "DEAD_LETTER_COUNTS",
    "DEFAULT_ALERTS_TOPIC",
    "DEFAULT_DLQ_TOPIC",
    "DEFAULT_EVENTS_TOPIC",
    "DEFAULT_USAGE_TOPIC",
    "EVENTS_TABLE",
    "HEALTH_SETTINGS",
    "PROJECTION_POSITIONS",
    "RELAY_POSITION",
    "SCHEMA",
    "SCHEMA_MIGRATIONS",
    "SNAPSHOTS_TABLE",
    "WEBHOOK_DELIVERIES",
    "WEBHOOK_ENDPOINTS",
    "WORKERS",
]

SCHEMA = "billing"

# eventsourcing names these after the application (``BillingLedger``), in the default schema.
EVENTS_TABLE = "billingledger_events"
SNAPSHOTS_TABLE = "billingledger_snapshots"

CONSUMER_POSITIONS = "consumer_positions"
RELAY_POSITION = "relay_position"
PROJECTION_POSITIONS = "projection_positions"
DEAD_LETTERS = "dead_letters"
DEAD_LETTER_COUNTS = "dead_letter_counts"
WORKERS = "workers"
CONSUMER_LAG = "consumer_lag"
HEALTH_SETTINGS = "health_settings"
SCHEMA_MIGRATIONS = "schema_migrations"
WEBHOOK_ENDPOINTS = "webhook_endpoints"
WEBHOOK_DELIVERIES = "webhook_deliveries"
# A read model (``projections.credits``) that a save of an account also writes
# (``store.credit_rows``): named here for the store.
CREDIT_BALANCES = "credit_balances"

DEFAULT_USAGE_TOPIC = "usage"
DEFAULT_DLQ_TOPIC = "usage.dlq"
DEFAULT_EVENTS_TOPIC = "billing.events"
# The relay's alerts lane publishes each spend alert crossing here (``adapters.alerts.relay``).
DEFAULT_ALERTS_TOPIC = "billing.alerts"
