"""A Stripe API emulator: the slice of Stripe's v1 REST API that the billing client uses.

The package serves a standard-library HTTP server (``ThreadingHTTPServer``) that the real
``stripe`` Python SDK can be pointed at (``StripeClient(key, base_addresses={"api": url})`` or
``stripe.api_base = url``).  It speaks Stripe's wire format: form-encoded request bodies with
nested keys (``metadata[k]=v``), JSON responses, the ``{"error": {...}}`` error shape, and
Stripe's v1 idempotency semantics (``Idempotency-Key`` replay, parameter mismatch, concurrent
use, key expiry).

It holds, in memory and behind one lock:

* customers, invoice items (live and deleted) and draft invoices;
* the idempotency-key store (scoped per API key);
* a ledger of every executed mutation and a log of every API request received;
* fault injection: latency, random 500s, outages (503 or refused connection), a sliding-window
  rate limiter (429), and "drop the response after executing" (the ambiguous timeout).

Endpoints served (all need ``Authorization: Bearer <key>``)::

    POST   /v1/customers                 GET /v1/customers/{id}     GET /v1/customers/search
    POST   /v1/invoiceitems              GET /v1/invoiceitems       GET /v1/invoiceitems/{id}
    DELETE /v1/invoiceitems/{id}         GET /v1/invoiceitems/search  (not in real Stripe)
    POST   /v1/invoices                  GET /v1/invoices/{id}

Control API (JSON, no auth) under ``/_emulator/``: ``health``, ``faults`` (GET/POST, partial
updates), ``reset``, ``ledger``, ``requests``, ``invoiceitems``.  The same operations exist as
methods of :class:`StripeEmulator`.  ``python -m infra.stripe_emulator --help`` runs it alone.

It is a test double: it does not persist anything, does not emulate search's eventual
consistency, and does not validate API keys beyond requiring one.

Modules: :mod:`.settings` (the settings), :mod:`.errors` (Stripe's error shapes),
:mod:`.forms` (request encoding, parameter checks), :mod:`.listing` (pagination, search),
:mod:`.idempotency` (keys), :mod:`.faults` (fault decisions), :mod:`.store` (objects),
:mod:`.customers`, :mod:`.invoice_items`, :mod:`.invoices` (endpoints), :mod:`.routes`
(routing), :mod:`.api` (the request pipeline), :mod:`.state` (what the lock guards),
:mod:`.server` (HTTP), :mod:`.control` (the control API), :mod:`.emulator` (the facade),
:mod:`.cli` (the command line).
"""

from __future__ import annotations

from .cli import main
from .emulator import StripeEmulator
from .settings import DEFAULT_KEY_TTL_S, DEFAULT_PORT, EmulatorSettings

__all__ = ["DEFAULT_KEY_TTL_S", "DEFAULT_PORT", "EmulatorSettings", "StripeEmulator", "main"]
