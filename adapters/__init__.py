"""Everything that touches the outside: PostgreSQL, Kafka, HTTP, the CLI. No business rules."""
