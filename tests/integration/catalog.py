"""The shape of a database's schema, read from PostgreSQL's catalog, to compare two
databases: tables and their options, columns (in order, with types, defaults, nullness
and generation), constraints, indexes, triggers, functions, views, composite types and
sequences, in the ``public`` and ``billing`` schemas. Names and definitions only: no
OIDs, no data."""

from __future__ import annotations

from typing import Any

import psycopg

__all__ = ["schema_shape"]

_SCHEMAS = ("public", "billing")

_QUERIES = {
    "relations": """
        SELECT n.nspname, c.relname, c.relkind, c.reloptions
        FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
        WHERE n.nspname = ANY(%(schemas)s) AND c.relkind IN ('r', 'v', 'S', 'c', 'p')
        ORDER BY 1, 2""",
    "columns": """
        SELECT n.nspname, c.relname, a.attnum, a.attname, format_type(a.atttypid, a.atttypmod),
               a.attnotnull, pg_get_expr(d.adbin, d.adrelid), a.attgenerated, a.attidentity
        FROM pg_attribute a
        JOIN pg_class c ON c.oid = a.attrelid
        JOIN pg_namespace n ON n.oid = c.relnamespace
        LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
        WHERE n.nspname = ANY(%(schemas)s) AND a.attnum > 0 AND NOT a.attisdropped
          AND c.relkind IN ('r', 'v', 'c', 'p')
        ORDER BY 1, 2, 3""",
    "constraints": """
        SELECT n.nspname, c.relname, k.conname, k.contype, pg_get_constraintdef(k.oid)
        FROM pg_constraint k
        JOIN pg_class c ON c.oid = k.conrelid
        JOIN pg_namespace n ON n.oid = c.relnamespace
        WHERE n.nspname = ANY(%(schemas)s)
        ORDER BY 1, 2, 3""",
    "indexes": """
        SELECT schemaname, tablename, indexname, indexdef FROM pg_indexes
        WHERE schemaname = ANY(%(schemas)s) ORDER BY 1, 2, 3""",
    "triggers": """
        SELECT n.nspname, c.relname, t.tgname, pg_get_triggerdef(t.oid)
        FROM pg_trigger t
        JOIN pg_class c ON c.oid = t.tgrelid
        JOIN pg_namespace n ON n.oid = c.relnamespace
        WHERE n.nspname = ANY(%(schemas)s) AND NOT t.tgisinternal
        ORDER BY 1, 2, 3""",
    "functions": """
        SELECT n.nspname, p.proname, pg_get_function_identity_arguments(p.oid),
               pg_get_functiondef(p.oid)
        FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
        WHERE n.nspname = ANY(%(schemas)s)
        ORDER BY 1, 2, 3""",
    "views": """
        SELECT schemaname, viewname, definition FROM pg_views
        WHERE schemaname = ANY(%(schemas)s) ORDER BY 1, 2""",
    "sequences": """
        SELECT s.schemaname, s.sequencename, s.data_type::text, s.start_value, s.increment_by,
               d.refobjid::regclass::text
        FROM pg_sequences s
        LEFT JOIN pg_depend d ON d.objid = format('%%I.%%I', s.schemaname, s.sequencename)::regclass
             AND d.deptype = 'a'
        WHERE s.schemaname = ANY(%(schemas)s) ORDER BY 1, 2""",
}


def schema_shape(url: str, *, without: tuple[str, ...] = ()) -> dict[str, list[tuple[Any, ...]]]:
    """Every object's definition, by kind; the objects of the tables (or functions, views)
    named in ``without`` left out."""
    with psycopg.connect(url) as conn:
        shape = {
            kind: [
                tuple(row)
                for row in conn.execute(query, {"schemas": list(_SCHEMAS)}).fetchall()
                if row[1] not in without
            ]
            for kind, query in _QUERIES.items()
        }
    return shape
