"""SQL read models in the ``billing`` schema: their tables, writers and queries."""
