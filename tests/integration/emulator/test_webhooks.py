"""Events and webhooks: Stripe's signature, retries, duplicates, reordering, resends.

Deliveries go to a real HTTP receiver in a thread; signatures are checked with the SDK's own
``stripe.Webhook.construct_event``.  Tests await deliveries (``wait_for_webhooks``, the
receiver's count) instead of sleeping.
"""

from __future__ import annotations

import socket
import threading
import time

import pytest
import stripe

from infra.stripe_emulator import StripeEmulator

from .support import Receiver, client_for, draft, http, new_customer, open_invoice, wait_until

pytestmark = pytest.mark.integration


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_deliveries_are_signed_as_stripe_signs_them(
    emulator: StripeEmulator, client: stripe.StripeClient, receiver: Receiver
) -> None:
    endpoint = emulator.add_webhook_endpoint(receiver.url)
    assert endpoint["secret"].startswith("whsec_")
    open_invoice(client, 100)

    assert emulator.wait_for_webhooks(5)
    got = receiver.received
    assert [r.event["type"] for r in got] == [e["type"] for e in emulator.events()]
    first = got[0]
    assert first.path == "/stripe/webhooks"
    assert first.headers["Content-Type"] == "application/json; charset=utf-8"
    signature = first.headers["Stripe-Signature"]
    assert signature.startswith("t=") and ",v1=" in signature
    event = stripe.Webhook.construct_event(first.body, signature, endpoint["secret"])
    assert (event.type, event.object, event.livemode) == ("invoice.created", "event", False)

    with pytest.raises(stripe.SignatureVerificationError):
        stripe.Webhook.construct_event(first.body + b" ", signature, endpoint["secret"])
    with pytest.raises(stripe.SignatureVerificationError):
        stripe.Webhook.construct_event(first.body, signature, "whsec_someone_else")
    assert all(e["pending_webhooks"] == 0 for e in emulator.events())


def test_a_delivery_answered_500_is_retried_with_backoff_until_accepted(
    emulator: StripeEmulator, client: stripe.StripeClient, receiver: Receiver
) -> None:
    emulator.set_faults(webhook_retry_base_s=0.05, webhook_max_attempts=5)
    emulator.add_webhook_endpoint(receiver.url, secret="whsec_test", events=["invoice.created"])
    receiver.statuses = [500, 503]
    invoice = draft(client, new_customer(client).id)

    assert emulator.wait_for_webhooks(5)
    got = receiver.wait_for(3)
    assert {r.event["data"]["object"]["id"] for r in got} == {invoice.id}
    deliveries = emulator.webhook_deliveries()
    assert [(d["attempt"], d["status"], d["ok"]) for d in deliveries] == [
        (1, 500, False),
        (2, 503, False),
        (3, 200, True),
    ]
    assert [d["retry_in_s"] for d in deliveries] == [0.05, 0.1, None]
    assert got[1].at - got[0].at >= 0.05
    assert got[2].at - got[1].at >= 0.1
    for delivered in got:  # every attempt is signed afresh and verifies
        stripe.Webhook.construct_event(
            delivered.body, delivered.headers["Stripe-Signature"], "whsec_test"
        )
    assert emulator.events("invoice.created")[0]["pending_webhooks"] == 0


def test_an_unreachable_endpoint_is_retried_then_given_up(
    emulator: StripeEmulator, client: stripe.StripeClient
) -> None:
    emulator.set_faults(webhook_retry_base_s=0.01, webhook_max_attempts=3)
    emulator.add_webhook_endpoint(
        f"http://127.0.0.1:{_closed_port()}/hook", events=["invoice.created"]
    )
    draft(client, new_customer(client).id)

    assert emulator.wait_for_webhooks(5)
    deliveries = emulator.webhook_deliveries()
    assert [(d["attempt"], d["status"]) for d in deliveries] == [(1, None), (2, None), (3, None)]
    assert all("Connection" in str(d["error"]) for d in deliveries)
    assert [d["gave_up"] for d in deliveries] == [False, False, True]
    assert emulator.events("invoice.created")[0]["pending_webhooks"] == 1


def test_duplicate_faults_deliver_the_same_event_twice(
    emulator: StripeEmulator, client: stripe.StripeClient, receiver: Receiver
) -> None:
    endpoint = emulator.add_webhook_endpoint(receiver.url, events=["invoice.created"])
    emulator.set_faults(webhook_duplicate_next=1)
    customer = new_customer(client)
    first, second = draft(client, customer.id), draft(client, customer.id)

    got = receiver.wait_for(3)
    assert emulator.wait_for_webhooks(5)
    assert [r.event["data"]["object"]["id"] for r in got] == [first.id, first.id, second.id]
    assert got[0].event["id"] == got[1].event["id"]  # the same event, twice
    assert [d["duplicate"] for d in emulator.webhook_deliveries()] == [False, True, False]
    for copy in got[:2]:
        stripe.Webhook.construct_event(
            copy.body, copy.headers["Stripe-Signature"], endpoint["secret"]
        )

    emulator.set_faults(webhook_duplicate_probability=1.0)
    draft(client, customer.id)
    assert len(receiver.wait_for(5)) == 5


def test_reorder_holds_a_window_and_delivers_it_newest_first(
    emulator: StripeEmulator, client: stripe.StripeClient, receiver: Receiver
) -> None:
    emulator.set_faults(webhook_reorder=3, webhook_reorder_hold_s=60)
    emulator.add_webhook_endpoint(receiver.url, events=["invoice.created"])
    customer = new_customer(client)
    window = [draft(client, customer.id) for _ in range(3)]

    got = receiver.wait_for(3)
    assert [r.event["data"]["object"]["id"] for r in got] == [i.id for i in reversed(window)]

    emulator.set_faults(webhook_reorder_hold_s=0.2)  # a partial window waits that long at most
    late = [draft(client, customer.id) for _ in range(2)]
    got = receiver.wait_for(5)
    assert [r.event["data"]["object"]["id"] for r in got[3:]] == [i.id for i in reversed(late)]
    assert emulator.wait_for_webhooks(5)


def test_delay_postpones_every_first_delivery(
    emulator: StripeEmulator, client: stripe.StripeClient, receiver: Receiver
) -> None:
    emulator.set_faults(webhook_delay_s=0.3)
    emulator.add_webhook_endpoint(receiver.url, events=["invoice.created"])
    customer = new_customer(client)
    started = time.monotonic()
    draft(client, customer.id)
    assert not emulator.wait_for_webhooks(0.1)  # still waiting out the delay
    got = receiver.wait_for(1)
    assert got[0].at - started >= 0.3


def test_a_resend_with_an_old_timestamp_fails_verification_and_a_fresh_one_passes(
    emulator: StripeEmulator, client: stripe.StripeClient, receiver: Receiver
) -> None:
    endpoint = emulator.add_webhook_endpoint(receiver.url, events=["invoice.created"])
    draft(client, new_customer(client).id)
    assert emulator.wait_for_webhooks(5)
    event = emulator.events("invoice.created")[0]
    old_t = int(time.time()) - 3600

    assert emulator.resend_event(event["id"], t=old_t) == 1
    assert emulator.resend_event(event["id"]) == 1
    assert emulator.wait_for_webhooks(5)
    original, stale, fresh = receiver.wait_for(3)
    assert original.event["id"] == stale.event["id"] == fresh.event["id"] == event["id"]
    secret = endpoint["secret"]
    with pytest.raises(stripe.SignatureVerificationError, match="tolerance"):
        stripe.Webhook.construct_event(stale.body, stale.headers["Stripe-Signature"], secret)
    stripe.WebhookSignature.verify_header(  # only its age is wrong
        stale.body, stale.headers["Stripe-Signature"], secret, tolerance=None
    )
    stripe.Webhook.construct_event(fresh.body, fresh.headers["Stripe-Signature"], secret)
    resends = [d for d in emulator.webhook_deliveries() if d["resend"]]
    assert [d["signature_t"] for d in resends][:1] == [old_t]

    receiver.statuses = [500]  # a resend is one attempt: a failure is not retried
    emulator.resend_event(event["id"])
    assert emulator.wait_for_webhooks(5)
    last = emulator.webhook_deliveries()[-1]
    assert (last["status"], last["attempt"], last["gave_up"]) == (500, 1, True)
    assert len(receiver.received) == 4


def test_endpoints_get_only_the_event_types_they_asked_for(
    emulator: StripeEmulator, client: stripe.StripeClient, receiver: Receiver
) -> None:
    invoices_only = emulator.add_webhook_endpoint(receiver.url + "?to=a", events=["invoice.*"])
    everything = emulator.add_webhook_endpoint(receiver.url + "?to=b", secret="whsec_b")
    invoice = open_invoice(client, 500)
    client.v1.credit_notes.create(params={"invoice": invoice.id, "amount": 100})
    assert emulator.wait_for_webhooks(5)

    to_a = [r for r in receiver.received if r.path.endswith("to=a")]
    to_b = [r for r in receiver.received if r.path.endswith("to=b")]
    assert to_a and all(r.event["type"].startswith("invoice.") for r in to_a)
    assert {"credit_note.created", "invoiceitem.created"} <= {r.event["type"] for r in to_b}
    for delivered, secret in [(to_a[0], invoices_only["secret"]), (to_b[0], "whsec_b")]:
        stripe.Webhook.construct_event(
            delivered.body, delivered.headers["Stripe-Signature"], secret
        )
    assert len(to_b) == len(emulator.events())
    assert everything["enabled_events"] == ["*"]


def test_events_api_lists_filters_and_keeps_the_object_as_it_was(
    emulator: StripeEmulator, client: stripe.StripeClient
) -> None:
    invoice = draft(client, new_customer(client).id)
    client.v1.invoice_items.create(
        params={"customer": str(invoice.customer), "invoice": invoice.id, "amount": 300}
    )
    client.v1.invoices.finalize_invoice(invoice.id, options={"idempotency_key": "finalize-1"})
    client.v1.invoices.pay(invoice.id)

    finalized = client.v1.events.list(params={"type": "invoice.finalized"})
    assert len(finalized.data) == 1
    event = client.v1.events.retrieve(finalized.data[0].id)
    assert event.data.object["status"] == "open"  # as it was then, though paid now
    assert event.request is not None
    assert event.request.idempotency_key == "finalize-1"
    assert str(event.request.id).startswith("req_")

    wildcard = client.v1.events.list(params={"type": "invoice.*", "limit": 100})
    assert wildcard.data and all(e.type.startswith("invoice.") for e in wildcard.data)
    chosen = client.v1.events.list(params={"types": ["invoice.paid", "invoice.finalized"]})
    assert [e.type for e in chosen.data] == ["invoice.paid", "invoice.finalized"]
    paged = client.v1.events.list(params={"limit": 2})
    assert len(list(paged.auto_paging_iter())) == len(emulator.events())
    created = int(event.created)
    assert client.v1.events.list(params={"created": {"gt": created + 60}}).data == []
    recent = client.v1.events.list(params={"created": {"gte": created - 60}, "limit": 100})
    assert len(recent.data) == len(emulator.events())
    with pytest.raises(stripe.InvalidRequestError) as missing:
        client.v1.events.retrieve("evt_nothing")
    assert missing.value.http_status == 404


def test_control_api_manages_endpoints_waits_and_resends(
    emulator: StripeEmulator, client: stripe.StripeClient, receiver: Receiver
) -> None:
    status, _, endpoint = http(
        emulator,
        "POST",
        "/_emulator/webhook_endpoints",
        {"url": receiver.url, "secret": "whsec_ctl", "events": ["invoice.created"]},
    )
    assert (status, endpoint["secret"]) == (200, "whsec_ctl")
    draft(client, new_customer(client).id)
    status, _, waited = http(emulator, "POST", "/_emulator/webhooks/wait", {"timeout": 5})
    assert (status, waited) == (200, {"done": True})
    _, _, deliveries = http(emulator, "GET", "/_emulator/webhook_deliveries")
    assert [(d["status"], d["endpoint_id"]) for d in deliveries] == [(200, endpoint["id"])]

    event_id = deliveries[0]["event_id"]
    status, _, queued = http(emulator, "POST", f"/_emulator/events/{event_id}/resend", {"t": 1})
    assert (status, queued) == (200, {"queued": 1})
    assert http(emulator, "POST", "/_emulator/webhooks/wait", {"timeout": 5})[2]["done"]
    _, _, again = http(emulator, "GET", f"/_emulator/webhook_deliveries?event_id={event_id}")
    assert [d["signature_t"] for d in again][-1] == 1
    _, _, events = http(emulator, "GET", "/_emulator/events?type=invoice.created")
    assert [e["id"] for e in events] == [event_id]

    path = f"/_emulator/webhook_endpoints/{endpoint['id']}"
    assert http(emulator, "DELETE", path)[0] == 200
    assert http(emulator, "DELETE", path)[0] == 404
    assert http(emulator, "GET", "/_emulator/webhook_endpoints")[2] == []
    assert http(emulator, "POST", "/_emulator/webhook_endpoints", {"url": "ftp://x"})[0] == 400
    assert http(emulator, "POST", "/_emulator/events/evt_nothing/resend")[0] == 404


def test_reset_forgets_endpoints_and_stop_ends_the_delivery_thread(receiver: Receiver) -> None:
    with StripeEmulator() as emu:
        name = f"stripe-emulator-webhooks:{emu.port}"
        assert name in {t.name for t in threading.enumerate()}
        emu.add_webhook_endpoint(receiver.url)
        emu.reset()
        assert (emu.webhook_endpoints(), emu.webhook_deliveries()) == ([], [])
        draft(client_for(emu), new_customer(client_for(emu)).id)
        assert emu.wait_for_webhooks(1)
        assert receiver.received == []
    wait_until(
        lambda: name not in {t.name for t in threading.enumerate()}, what="sender thread stop"
    )


def test_a_restarted_emulator_has_one_sender_and_delivers_again(receiver: Receiver) -> None:
    emu = StripeEmulator()
    emu.start()
    emu.stop()
    emu.start()
    try:
        emu.add_webhook_endpoint(receiver.url, events=["invoice.created"])
        draft(client_for(emu), new_customer(client_for(emu)).id)
        assert emu.wait_for_webhooks(5)
        assert len(receiver.wait_for(1)) == 1
        senders = [
            t for t in threading.enumerate() if t.name.startswith("stripe-emulator-webhooks")
        ]
        assert [t.name for t in senders] == [f"stripe-emulator-webhooks:{emu.port}"]
    finally:
        emu.stop()
