"""Test and development infrastructure for billing-ledger (emulators of external services)."""
