"""Spend alerts leaving the ledger: the ``billing.alerts`` topic's records
(``messages``) and the outgoing webhooks (``endpoints``, ``deliveries``, ``sender``,
``worker``)."""
