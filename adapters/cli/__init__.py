"""The ``billing-ledger`` command line (``adapters.cli.main``)."""

from __future__ import annotations

from adapters.cli.main import main

__all__ = ["main"]
