"""The billing model: money, pricing, usage, the transaction and account aggregates.

Pure: imports the standard library, ``eventsourcing`` and pydantic only (checked by
``tests/unit/test_domain_imports.py``).
"""
