"""Stripe's webhooks: ``POST /webhooks/stripe`` verified, deduplicated and applied to
the invoices (``handler``), served on a listener of its own (``app``)."""
