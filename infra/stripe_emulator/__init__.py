"""A Stripe API emulator: the slice of Stripe's v1 REST API that the billing client uses.

The package serves a standard-library HTTP server (``ThreadingHTTPServer``) that the real
``stripe`` Python SDK can be pointed at (``StripeClient(key, base_addresses={"api": url})`` or
``stripe.api_base = url``).  It speaks Stripe's wire format: form-encoded request bodies with
nested keys (``metadata[k]=v``), JSON responses, the ``{"error": {...}}`` error shape, and
Stripe's v1 idempotency semantics on every POST and DELETE (``Idempotency-Key`` replay, even
of an error; parameter mismatch 400; concurrent use 409; key expiry).

It holds, in memory and behind one lock:

* customers, invoice items (live and deleted), invoices (draft, open, paid, void,
  uncollectible), credit notes and events;
* the idempotency-key store (scoped per API key);
* webhook endpoints and their deliveries, sent from a background thread with Stripe's
  ``Stripe-Signature`` and retried with exponential backoff;
* a ledger of every executed mutation and a log of every API request received;
* fault injection: latency, random 500s, outages (503 or refused connection), sliding-window
  rate limits (global and per endpoint, 429), "drop the response after executing" (the
  ambiguous timeout), declined payments, and webhook delays, duplicates and reordering.

Endpoints served (all need ``Authorization: Bearer <key>``)::

    POST   /v1/customers                  GET /v1/customers/{id}     GET /v1/customers/search
    POST   /v1/invoiceitems               GET /v1/invoiceitems       GET /v1/invoiceitems/{id}
    POST   /v1/invoiceitems/{id}          DELETE /v1/invoiceitems/{id}
    GET    /v1/invoiceitems/search        (not in real Stripe)
    POST   /v1/invoices                   GET /v1/invoices           GET /v1/invoices/search
    GET    /v1/invoices/{id}              POST /v1/invoices/{id}     GET /v1/invoices/{id}/lines
    DELETE /v1/invoices/{id}              (a draft only)
    POST   /v1/invoices/{id}/add_lines    POST /v1/invoices/{id}/update_lines
    POST   /v1/invoices/{id}/finalize     POST /v1/invoices/{id}/pay
    POST   /v1/invoices/{id}/void         POST /v1/invoices/{id}/mark_uncollectible
    POST   /v1/credit_notes               GET /v1/credit_notes       GET /v1/credit_notes/{id}
    GET    /v1/events                     GET /v1/events/{id}

Stripe's rules it keeps (see the modules): an invoice holds at most 250 items; items on a
finalized invoice cannot be changed or deleted, nor its lines added or updated
(``add_lines`` makes a draft's new items together; ``update_lines`` names a draft's lines
by line item ids of their own; at most 50 a request); finalizing
numbers the invoice ``{customer.invoice_prefix}-0001``; a declined payment is a 402
``card_error`` and leaves the invoice open; credit notes never exceed the invoice total,
and a paid invoice's credit must be given out by
``credit_amount``/``refund_amount``/``out_of_band_amount``.

Control API (JSON, no auth) under ``/_emulator/``: ``health``, ``faults`` (GET/POST, partial
updates), ``reset``, ``ledger``, ``requests``, ``invoiceitems``, ``invoices``,
``credit_notes``, ``events``, ``webhook_endpoints`` (GET/POST/DELETE), ``webhook_deliveries``,
``webhooks/wait``, ``events/{id}/resend``, ``invoices/{id}/pay``,
``invoices/{id}/fail_payment``, ``customers/{id}/card_declined`` (see :mod:`.control`).  The
same operations exist as methods of :class:`StripeEmulator`.  ``python -m
infra.stripe_emulator --help`` runs it alone.

It is a test double: it does not persist anything, does not emulate search's eventual
consistency, and does not validate API keys beyond requiring one.  Nothing starts at import:
the server and the webhook sender run between ``start()`` and ``stop()``.

Modules: :mod:`.settings` (the settings), :mod:`.errors` (Stripe's error shapes),
:mod:`.forms` (request encoding, parameter checks), :mod:`.listing` (pagination, search),
:mod:`.idempotency` (keys), :mod:`.faults` (fault decisions), :mod:`.store` (objects),
:mod:`.customers`, :mod:`.invoice_items`, :mod:`.invoices`, :mod:`.invoice_actions`,
:mod:`.credit_notes`, :mod:`.events` (endpoints), :mod:`.routes` (routing), :mod:`.api` (the
request pipeline), :mod:`.webhooks` (endpoints, queue, signature), :mod:`.webhook_sender`
(the delivery thread), :mod:`.state` (what the lock guards), :mod:`.server` (HTTP),
:mod:`.control` (the control API), :mod:`.emulator` (the facade), :mod:`.cli` (the command
line).
"""

from __future__ import annotations

from .cli import main
from .emulator import StripeEmulator
from .settings import DEFAULT_KEY_TTL_S, DEFAULT_PORT, EmulatorSettings

__all__ = ["DEFAULT_KEY_TTL_S", "DEFAULT_PORT", "EmulatorSettings", "StripeEmulator", "main"]
