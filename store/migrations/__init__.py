"""Schema migrations: the only way the database's schema changes, run once by ``migrate``.

Until migrations, every process ran the schema's DDL at start, and ``ALTER TABLE ...
ADD COLUMN IF NOT EXISTS`` takes an ACCESS EXCLUSIVE lock on the events table even
when the column exists: a starting worker stopped every event write of the fleet, and
deadlocked with the writers' inserts (issue 11). Now the schema is a numbered list of
SQL files in this package (``0001_initial.sql``, ...), applied in order by
``billing-ledger migrate`` (``store.migrations.runner``) and recorded in
``billing.schema_migrations`` (number, name, SHA-256 of the file, when, how long).
Workers run no DDL: they read that table and wait until it is current
(``store.migrations.status``: ``schema_status`` / ``wait_until_current``).

A migration is a file ``NNNN_name.sql`` (4 digits, numbered 1..N without gaps; a name
of ``a-z 0-9 _``), executed as one simple-protocol query. Never edit a released file:
add the next one.
"""
