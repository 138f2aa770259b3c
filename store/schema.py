"""The database's layout and the broker's topics: every name, and the DDL the store owns.

Every table, view and topic the ledger uses is named here, so a reader finds them in
one place and no module spells a name of its own. Three kinds of tables live in the
``billing`` schema besides the read models (whose DDL is each projection's own, in
``projections/``):

* positions: how far each follower has read (``relay_position``,
  ``projection_positions``, ``consumer_positions``);
* stores that workers write and nothing rebuilds: ``dead_letters`` (and its
  ``dead_letter_counts``), ``workers``, ``consumer_lag``;
* ``health_settings``: the deadlines ``billing.queue_health`` judges by.

The events and snapshots tables are eventsourcing's (created by its recorder, named
after the application); ``store.recorder.LedgerRecorder`` adds the columns and the
append-only trigger below to the events table.
"""

from __future__ import annotations

from psycopg import sql

__all__ = [
    "CONSUMER_LAG",
    "CONSUMER_POSITIONS",
    "DEAD_LETTERS",
    "DEAD_LETTER_COUNTS",
    "DEFAULT_DLQ_TOPIC",
    "DEFAULT_EVENTS_TOPIC",
    "DEFAULT_USAGE_TOPIC",
    "EVENTS_TABLE",
    "HEALTH_SETTINGS",
    "PROJECTION_POSITIONS",
    "RELAY_POSITION",
    "SCHEMA",
    "SNAPSHOTS_TABLE",
    "WORKERS",
    "events_table_statements",
    "store_ddl",
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

DEFAULT_USAGE_TOPIC = "usage"
DEFAULT_DLQ_TOPIC = "usage.dlq"
DEFAULT_EVENTS_TOPIC = "billing.events"


def events_table_statements(table: sql.Composable, schema: str) -> list[sql.Composed]:
    """What ``LedgerRecorder`` adds to eventsourcing's events table: the writing
    transaction's id (for the gap-free reader), the hash chain, and a trigger that
    refuses UPDATE, DELETE and TRUNCATE."""
    guard = sql.Identifier(schema, "billing_events_append_only")
    return [
        sql.SQL(
            "ALTER TABLE {0} ADD COLUMN IF NOT EXISTS "
            "xid xid8 NOT NULL DEFAULT pg_current_xact_id()"
        ).format(table),
        sql.SQL(
            "ALTER TABLE {0} ADD COLUMN IF NOT EXISTS prev_hash bytea, "
            "ADD COLUMN IF NOT EXISTS hash bytea"
        ).format(table),
        sql.SQL(
            "CREATE OR REPLACE FUNCTION {0}() RETURNS trigger LANGUAGE plpgsql AS "
            "$$BEGIN RAISE EXCEPTION 'billing-ledger events are append-only "
            "(% refused on %)', TG_OP, TG_TABLE_NAME; END$$"
        ).format(guard),
        sql.SQL(
            "CREATE OR REPLACE TRIGGER events_append_only "
            "BEFORE UPDATE OR DELETE OR TRUNCATE "
            "ON {0} FOR EACH STATEMENT EXECUTE FUNCTION {1}()"
        ).format(table, guard),
    ]


_STORE_DDL = """
CREATE SCHEMA IF NOT EXISTS billing;
CREATE TABLE IF NOT EXISTS billing.consumer_positions (
    group_name  text    NOT NULL,
    topic       text    NOT NULL,
    partition   integer NOT NULL,
    next_offset bigint  NOT NULL,
    PRIMARY KEY (group_name, topic, partition)
);
CREATE TABLE IF NOT EXISTS billing.relay_position (
    name            text PRIMARY KEY,
    xid             xid8   NOT NULL,
    notification_id bigint NOT NULL
);
CREATE INDEX IF NOT EXISTS {events_xid_idx} ON {events} (xid, notification_id);
CREATE TABLE IF NOT EXISTS billing.projection_positions (
    name            text   PRIMARY KEY,
    xid             xid8   NOT NULL,
    notification_id bigint NOT NULL
);
CREATE TABLE IF NOT EXISTS billing.dead_letters (
    source_topic     text        NOT NULL,
    source_partition integer     NOT NULL,
    source_offset    bigint      NOT NULL,
    record_key       bytea,
    payload          bytea,
    reason           text        NOT NULL CHECK (reason <> ''),
    received_at      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (source_topic, source_partition, source_offset)
);
CREATE INDEX IF NOT EXISTS dead_letters_received_at_idx ON billing.dead_letters (received_at);
-- Issue 11 (bounded dead letters; to be folded into a numbered migration): a row keeps a
-- prefix of the payload with the whole one's size and hash, and its reason's code;
-- the counts per source topic, code and hour outlive the rows retention removes.
ALTER TABLE billing.dead_letters
    ADD COLUMN IF NOT EXISTS reason_code    text,
    ADD COLUMN IF NOT EXISTS payload_size   integer,
    ADD COLUMN IF NOT EXISTS payload_sha256 bytea;
CREATE TABLE IF NOT EXISTS billing.dead_letter_counts (
    hour         timestamptz NOT NULL,
    source_topic text        NOT NULL,
    reason_code  text        NOT NULL,
    letters      bigint      NOT NULL CHECK (letters > 0),
    PRIMARY KEY (hour, source_topic, reason_code)
);
-- Letters stored before the counts existed are counted once, when the table is new.
INSERT INTO billing.dead_letter_counts (hour, source_topic, reason_code, letters)
SELECT date_trunc('hour', received_at), source_topic, coalesce(reason_code, 'invalid'), count(*)
FROM billing.dead_letters
WHERE NOT EXISTS (SELECT 1 FROM billing.dead_letter_counts)
GROUP BY 1, 2, 3;
CREATE TABLE IF NOT EXISTS billing.health_settings (
    id                   integer PRIMARY KEY CHECK (id = 1),
    retry_horizon_s      double precision NOT NULL,
    reconcile_interval_s double precision NOT NULL,
    stale_after_s        double precision NOT NULL,
    heartbeat_timeout_s  double precision NOT NULL
);
INSERT INTO billing.health_settings VALUES (1, 3600, 5, 30, 30) ON CONFLICT (id) DO NOTHING;
CREATE TABLE IF NOT EXISTS billing.workers (
    worker_id     text        PRIMARY KEY,
    roles         text[]      NOT NULL,
    host          text        NOT NULL,
    pid           integer     NOT NULL,
    started_at    timestamptz NOT NULL,
    heartbeat_at  timestamptz NOT NULL,
    breaker_state text,
    stats         jsonb       NOT NULL DEFAULT '{{}}'
);
CREATE TABLE IF NOT EXISTS billing.consumer_lag (
    group_name       text        NOT NULL,
    topic            text        NOT NULL,
    partition        integer     NOT NULL,
    committed_offset bigint      NOT NULL,
    end_offset       bigint      NOT NULL,
    lag              bigint      NOT NULL,
    recorded_at      timestamptz NOT NULL,
    PRIMARY KEY (group_name, topic, partition)
);
"""


def store_ddl() -> sql.Composed:
    """Every table of the ``billing`` schema the store owns (idempotent); run after
    the events table exists."""
    return sql.SQL(_STORE_DDL).format(
        events=sql.Identifier(EVENTS_TABLE),
        events_xid_idx=sql.Identifier(f"{EVENTS_TABLE}_xid_idx"),
    )
