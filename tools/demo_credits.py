"""The demo's credits scene: a customer burns a prepaid grant to zero and is cut off, a
spend alert reaches a real webhook receiver signed, and an automatic top-up is bought,
paid and used; what happened, read back from the ledger for the summary.

Run by ``billing-ledger demo`` once the other customers' invoices are paid, with the
same database, broker and Stripe emulator (``run_credit_scene``), as an operator would
with ``credits policy``, ``credits grant``, ``alerts set``, ``webhooks add`` and
``credits top-up set``:

* ``CREDIT_CUSTOMER`` has the policy ``block`` and a promotional grant of ``GRANT``;
  alerts (``ALERTS``) at a live balance of 15.00 and at half the grant consumed; an
  automatic top-up (below ``TOP_UP_BELOW``, buy ``TOP_UP_BUY`` for ``TOP_UP_PRICE``);
  and a webhook endpoint for ``alert.crossed`` on a small HTTP receiver on 127.0.0.1
  (``Receiver``), which verifies each delivery with ``billing_ledger_webhooks.verify``;
* ``BURN_RECORDS`` usage records of ``RECORD`` each go to the usage topic: the first
  ``GRANT // RECORD`` burn the grant to zero (the top-up starts as the balance falls
  below its threshold, its grant pending until paid), the rest are refused with the
  reason ``credits exhausted`` (compensated, never billed);
* the reconciler makes the top-up's one-off invoice in Stripe; the demo pays it, the
  emulator's ``invoice.paid`` webhook makes the purchased grant live, and
  ``AFTER_RECORDS`` more records are accepted against it.

Every wait polls a condition with a deadline; nothing sleeps for a fixed time.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from email.message import Message
from typing import Any

from adapters.alerts import deliveries
from adapters.alerts.endpoints import resolve_target
from adapters.alerts.messages import ALERT_CROSSED
from adapters.bootstrap import database
from adapters.ingest.producer import UsageProducer
from adapters.roles import run_roles
from adapters.settings import Settings
from billing_ledger_webhooks import SIGNATURE_HEADER, SignatureError, verify
from domain.account import CustomerAccount
from domain.credits import GrantState, top_up_grant_id
from domain.ids import account_id, purchase_id
from domain.money import format_money
from domain.purchase import PurchaseState
from infra.stripe_emulator import StripeEmulator
from store.ledger import BillingLedger
from tools.loopback import serve_posts

__all__ = [
    "AFTER_RECORDS",
    "ALERTS",
    "BURN_RECORDS",
    "CREDIT_CUSTOMER",
    "GRANT",
    "GRANT_ID",
    "RECORD",
    "TOP_UP_BUY",
    "TOP_UP_PRICE",
    "Receiver",
    "credits_headline",
    "run_credit_scene",
]

CREDIT_CUSTOMER = "pied-piper"
CURRENCY = "USD"
METER = "api.requests"
GRANT_ID = "welcome"
GRANT = 5000  # 50.00 USD, promotional
RECORD = 500  # what each of the scene's records costs: 5.00 USD
BURN_RECORDS = 13  # 10 burn the grant to zero, 3 are refused
AFTER_RECORDS = 2  # accepted once the top-up is live
# Alerts: when the live balance is down to 15.00 USD, and when half the grant is consumed.
ALERTS = ["balance:1500", "percent_of_grant:50"]
TOP_UP_BELOW, TOP_UP_BUY, TOP_UP_PRICE = 1000, 5000, 4500  # below 10.00 buy 50.00 for 45.00
ROLES = ["ingest", "relay", "project", "charge", "reconcile", "webhooks", "alerts"]


class Receiver:
    """A webhook receiver on 127.0.0.1, as a customer would run one: it verifies each
    delivery's signature with the shipped ``verify`` (400 when it does not check out)
    and keeps every request as it came (body and signature header)."""

    def __init__(self) -> None:
        self.secret = ""  # the endpoint's, given once at registration
        self.requests: list[tuple[bytes, str]] = []
        self.verified: list[dict[str, Any]] = []
        self.refused = 0
        self.lock = threading.Lock()
        self.server, self.url = serve_posts(self._post, "/billing-alerts")

    def _post(self, body: bytes, headers: Message[str, str]) -> tuple[int, dict[str, str]]:
        return self.receive(body, headers[SIGNATURE_HEADER] or ""), {}

    def receive(self, body: bytes, signature: str) -> int:
        with self.lock:
            self.requests.append((body, signature))
            try:
                event = verify(body, signature, self.secret)
            except SignatureError:
                self.refused += 1
                return 400
            self.verified.append(event)
        return 200

    def received(self) -> list[dict[str, Any]]:
        with self.lock:
            return list(self.verified)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def run_credit_scene(
    settings: Settings,
    ledger: BillingLedger,
    stripe: StripeEmulator,
    *,
    deadline: float,
    receiver: Receiver | None = None,
) -> dict[str, Any]:
    """The scene on ``settings`` (wired to ``stripe``, whose webhooks reach the ledger's
    listener on ``settings.webhook_port``); what happened, read back from the ledger.
    The alerts go to ``receiver`` (a new one if not given), closed at the end."""
    from adapters.progress import step

    step("credits: a customer burns its grant to zero, is cut off, alerted and topped up")
    started = time.monotonic()
    scene = settings.model_copy(
        update={
            "alert_webhook_allow_private": True,  # the receiver is on 127.0.0.1
            "alert_webhook_retry_base_s": 0.05,
            "alert_webhook_retry_max_delay_s": 0.2,
            "ingest_processes": 1,  # the ingest role in this process: a handful of records
        }
    )
    receiver = receiver or Receiver()
    try:
        _set_up(scene, ledger, receiver)
        stop = threading.Event()
        workers = threading.Thread(
            target=run_roles, args=(scene, ledger, ROLES, stop), kwargs={"log_level": "ERROR"}
        )
        workers.start()
        try:
            said = _play(scene, ledger, stripe, receiver, deadline, stop)
        finally:
            stop.set()
            workers.join()
    finally:
        receiver.close()
    return {**said, "seconds": round(time.monotonic() - started, 2)}


def _set_up(settings: Settings, ledger: BillingLedger, receiver: Receiver) -> None:
    """The customer's account and the receiver's endpoint, as the CLI would set them."""
    resolve_target(receiver.url, allow_private=settings.alert_webhook_allow_private)
    with database(settings, pool_size=0).connection() as conn:
        _, receiver.secret = deliveries.add_endpoint(conn, receiver.url, [ALERT_CROSSED])

    def account(a: CustomerAccount) -> None:
        a.set_credit_policy("block")
        a.grant_credit(GRANT_ID, GRANT, effective_at=datetime.now(UTC) - timedelta(minutes=5),
                       source="promotional", reason="demo: welcome credit")  # fmt: skip
        a.set_top_up(TOP_UP_BELOW, TOP_UP_BUY, TOP_UP_PRICE)

    ledger.change_account(CREDIT_CUSTOMER, CURRENCY, account)
    ledger.set_alerts(CREDIT_CUSTOMER, CURRENCY, ALERTS)


def _play(  # noqa: PLR0917
    settings: Settings,
    ledger: BillingLedger,
    stripe: StripeEmulator,
    receiver: Receiver,
    deadline: float,
    stop: threading.Event,
) -> dict[str, Any]:
    start = datetime.now(UTC) - timedelta(minutes=1)
    quantity = _quantity(ledger, start)
    with UsageProducer(settings.kafka_bootstrap, settings.usage_topic) as usage:

        def send(first: int, count: int) -> None:
            for i in range(first, first + count):
                usage.send(customer_id=CREDIT_CUSTOMER, usage_id=f"credit-{i:02d}", meter=METER,
                           quantity=quantity, occurred_at=start + timedelta(seconds=i))  # fmt: skip
            usage.flush()

        send(1, BURN_RECORDS)
        _await(lambda: _decided(settings) >= BURN_RECORDS, deadline, stop, "the burn recorded")
        bought = purchase_id(CREDIT_CUSTOMER, CURRENCY, top_up_grant_id(1, 1))

        def invoiced() -> str | None:
            purchase = ledger.purchase_by_id(bought)
            ready = purchase is not None and purchase.state is PurchaseState.FINALIZED
            return purchase.stripe_invoice_id if ready and purchase else None

        invoice = _await(invoiced, deadline, stop, "the top-up's invoice")
        stripe.pay_invoice(invoice)
        _await(lambda: _top_up_live(ledger), deadline, stop, "invoice.paid to make it live")
        send(BURN_RECORDS + 1, AFTER_RECORDS)
        total = BURN_RECORDS + AFTER_RECORDS
        _await(lambda: _decided(settings) >= total, deadline, stop, "the usage after it")
    _await(lambda: len(receiver.received()) >= len(ALERTS), deadline, stop, "the alerts")
    return _summary(settings, ledger, receiver, quantity)


def _quantity(ledger: BillingLedger, moment: datetime) -> Decimal:
    """How many units of ``METER`` cost ``RECORD`` by the price in force at ``moment``."""
    price = ledger.refresh_prices().price_at(moment).prices.price_of(METER)
    quantity = RECORD / price.exact_amount(Decimal(1))
    if quantity != quantity.to_integral_value():
        raise ValueError(f"{METER} cannot cost exactly {RECORD} minor units a record")
    return quantity.quantize(Decimal(1))


def _await(condition: Callable[[], Any], deadline: float, stop: threading.Event, what: str) -> Any:
    """Poll ``condition`` until it gives something truthy; TimeoutError at ``deadline``."""
    while True:
        value = condition()
        if value:
            return value
        if stop.is_set():
            raise RuntimeError(f"the workers stopped before {what}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what}")
        stop.wait(0.05)


def _decided(settings: Settings) -> int:
    """The scene's records the ledger has recorded (the read model, projected)."""
    return sum(_states(settings).values())


def _states(settings: Settings) -> Counter[tuple[str, str | None]]:
    with database(settings, pool_size=0) as db, db.connection() as conn:
        rows = conn.execute(
            "SELECT state, compensation_reason, count(*) FROM billing.transactions"
            " WHERE customer_id = %s GROUP BY 1, 2",
            (CREDIT_CUSTOMER,),
        ).fetchall()
    return Counter({(str(s), r): int(n) for s, r, n in rows})


def _top_up_live(ledger: BillingLedger) -> bool:
    account = ledger.account(CREDIT_CUSTOMER, CURRENCY)
    grant = account.grants.get(top_up_grant_id(1, 1)) if account else None
    return grant is not None and grant.state is GrantState.LIVE


def _summary(
    settings: Settings, ledger: BillingLedger, receiver: Receiver, quantity: Decimal
) -> dict[str, Any]:
    account = ledger.account(CREDIT_CUSTOMER, CURRENCY)
    assert account is not None
    events = ledger.events.get(account_id(CREDIT_CUSTOMER, CURRENCY))
    started = [e for e in events if isinstance(e, CustomerAccount.TopUpStarted)]
    states = _states(settings)
    grants = {
        g.grant_id: {
            "source": g.source, "amount": g.amount, "consumed": f"{g.consumed:f}",
            "expired": f"{g.expired:f}", "voided": f"{g.voided:f}",
            "remaining": f"{g.remaining:f}", "state": str(g.state),
        }
        for g in account.grants.values()
    }  # fmt: skip
    top_up = top_up_grant_id(1, 1)
    purchase = ledger.purchase_by_id(purchase_id(CREDIT_CUSTOMER, CURRENCY, top_up))
    return {
        "customer_id": CREDIT_CUSTOMER,
        "currency": CURRENCY,
        "policy": account.credit_policy,
        "record_amount": RECORD,
        "quantity": f"{quantity:f}",
        "records_sent": BURN_RECORDS + AFTER_RECORDS,
        "burn_records": BURN_RECORDS,
        "accepted": sum(n for (state, _), n in states.items() if state != "compensated"),
        "refused": {
            str(reason): n for (state, reason), n in states.items() if state == "compensated"
        },
        "grant_id": GRANT_ID,
        "grants": grants,
        "balance": f"{account.credit_remaining:f}",
        "alerts": [
            {
                "threshold": f"{a['threshold']['kind']}:{a['threshold']['value']}",
                "value": a["value"],
                "usage_id": a["usage_id"],
                "id": a["id"],
            }
            for a in receiver.received()
        ],
        "alerts_refused": receiver.refused,
        "top_up": {
            "below": TOP_UP_BELOW,
            "buy": TOP_UP_BUY,
            "price": TOP_UP_PRICE,
            "started": len(started),
            "grant_id": top_up,
            "purchase": str(purchase.state) if purchase else None,
            "stripe_invoice_id": purchase.stripe_invoice_id if purchase else None,
        },
    }


def credits_headline(credits: dict[str, Any]) -> list[str]:
    """The credits scene's part of the demo's opening sentences."""
    cur = credits["currency"]

    def money(minor: str | int) -> str:
        return format_money(Decimal(minor), cur)

    grant = credits["grants"][credits["grant_id"]]
    burned = round(Decimal(grant["consumed"]) / credits["record_amount"])
    refused = sum(credits["refused"].values())
    reasons = ", ".join(f"{n} {r}" for r, n in sorted(credits["refused"].items()))
    alerts = "; ".join(
        f"{a['threshold']} (at {a['usage_id']}, value {money(a['value'])})"
        for a in credits["alerts"]
    )
    up = credits["top_up"]
    bought = credits["grants"].get(up["grant_id"])
    after = credits["accepted"] - burned
    return [
        f"Credits: {credits['customer_id']} (policy {credits['policy']}) got a"
        f" {grant['source']} grant of {money(grant['amount'])}; {burned} records of"
        f" {money(credits['record_amount'])} burned it to {money(grant['remaining'])}"
        f" (granted {money(grant['amount'])} = consumed {money(grant['consumed'])} + expired"
        f" {money(grant['expired'])} + voided {money(grant['voided'])} + remaining"
        f" {money(grant['remaining'])}), and {refused} more were refused ({reasons}), not"
        " billed.",
        f"Alerts received by the demo's webhook receiver on 127.0.0.1, signature verified:"
        f" {alerts or 'none'}"
        + (
            f" ({credits['alerts_refused']} refused: bad signature)"
            if credits["alerts_refused"]
            else ""
        )
        + ".",
        f"Top-up (below {money(up['below'])}, buy {money(up['buy'])} for"
        f" {money(up['price'])}): started {_times(up['started'])}, its invoice"
        f" {up['stripe_invoice_id']} {up['purchase']}, grant {up['grant_id']}"
        f" {bought['state'] if bought else 'missing'}; {after} more records accepted after it"
        f" (credit left {money(credits['balance'])}); the scene took"
        f" {credits.get('seconds', 0):.1f}s.",
    ]


def _times(n: int) -> str:
    return {0: "never", 1: "once"}.get(n, f"{n} times")
