"""``StripeGateway``'s requests without a network (the SDK over a recording transport,
as httpx's MockTransport fakes the transport, not the code): each call's method, path,
idempotency key and amount. Keys derive from the ledger's ids and steps, never from a
clock, so a retry after any crash sends the same key; a repair has a key of its own."""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any
from urllib.parse import parse_qs
from uuid import UUID

import stripe

from adapters.settings import StripeSettings
from adapters.stripe.client import StripeGateway
from domain.periods import Period
from domain.ports import CreditNote, DraftInvoice, ItemRepair, LineItems
from domain.pushing import ItemStep, PushPlan
from domain.verification import DraftItem, DraftView

LINE, INVOICE, TXN = UUID(int=11), UUID(int=22), UUID(int=33)
PERIOD = Period(datetime(2026, 12, 1, tzinfo=UTC), datetime(2027, 1, 1, tzinfo=UTC))


class Recording(stripe.HTTPClient):
    """Answers every request with ``answer(method, path)`` and remembers it."""

    name = "recording"

    def __init__(self, answer: Any) -> None:
        super().__init__()
        self.answer = answer
        self.sent: list[tuple[str, str, str | None, dict[str, list[str]]]] = []

    def request(  # type: ignore[override]
        self, method: str, url: str, headers: Mapping[str, str] | None, post_data: Any = None,
        **_: Any,
    ) -> tuple[str, int, Mapping[str, str]]:  # fmt: skip
        path = url.split("//", 1)[-1].split("/", 1)[-1].split("?", 1)[0]
        body = post_data.decode() if isinstance(post_data, bytes) else (post_data or "")
        key = (headers or {}).get("Idempotency-Key")
        self.sent.append((method.upper(), "/" + path, key, parse_qs(body)))
        return json.dumps(self.answer(method.upper(), "/" + path)), 200, {}

    def close(self) -> None:
        pass


def _gateway(answer: Any) -> tuple[StripeGateway, Recording]:
    gateway = StripeGateway(StripeSettings(api_base="http://127.0.0.1:9"))
    transport = Recording(answer)
    gateway.client = stripe.StripeClient(
        "sk_test_x", base_addresses={"api": "http://127.0.0.1:9"}, max_network_retries=0,
        http_client=transport,
    )  # fmt: skip
    return gateway, transport


def _object(method: str, path: str) -> dict[str, Any]:
    kind = path.split("/")[2]
    prefix = {"customers": "cus", "invoices": "in", "invoiceitems": "ii", "credit_notes": "cn"}
    return {
        "id": f"{prefix.get(kind, 'x')}_1", "object": kind.rstrip("s"), "status": "open",
        "number": "N-1", "total": 100, "amount_paid": 0, "attempt_count": 0,
        "next_payment_attempt": None, "created": 1, "status_transitions": {},
    }  # fmt: skip


def test_creates_are_keyed_by_the_ledgers_ids_and_updates_by_line_item_and_sequence() -> None:
    gateway, sent = _gateway(_object)
    assert gateway.customer("acme", look_first=False) == "cus_1"
    draft = DraftInvoice(INVOICE, "acme", "cus_1", "USD", PERIOD)
    assert gateway.draft_invoice(draft, look_first=False) == "in_1"
    plan = PushPlan(7, 300, (ItemStep(0, 300, None, 5, 200, update=True),), ((0, 5, 200),))
    items = LineItems(LINE, "api.requests", PERIOD, "cus_1", "in_1", "USD", plan, False)
    assert gateway.set_line_items(items) == ["ii_1"]
    assert [(m, p, k) for m, p, k, _ in sent.sent] == [
        ("POST", "/v1/customers", "customer:acme"),
        ("POST", "/v1/invoices", f"invoice:{INVOICE}"),
        ("POST", "/v1/invoiceitems", f"line-item:{LINE}:0"),
        ("POST", "/v1/invoiceitems/ii_1", f"line-push:{LINE}:0:7"),
    ]
    created, updated = sent.sent[2][3], sent.sent[3][3]
    assert (created["amount"], created["metadata[sequence]"]) == (["200"], ["5"])  # as planned
    assert (updated["amount"], updated["metadata[sequence]"]) == (["300"], ["7"])


def test_a_repair_push_finalize_and_credit_note_each_have_their_own_key() -> None:
    gateway, sent = _gateway(_object)
    plan = PushPlan(7, 300, (ItemStep(0, 300, "ii_1", update=True),), (), repair=2)
    items = LineItems(LINE, "api.requests", PERIOD, "cus_1", "in_1", "USD", plan, False)
    gateway.set_line_items(items)
    gateway.repair_items([ItemRepair("ii_1", 300, 7, "line-repair:L:0:7:1")])
    view = gateway.finalize_invoice("in_1", INVOICE, look_first=False)
    assert not isinstance(view, stripe.StripeError)
    note = CreditNote(INVOICE, "in_1", TXN, 25, after_payment=True, memo="reversal")
    assert gateway.credit_note(note) == "cn_1"
    assert [(p, k) for _, p, k, _ in sent.sent] == [
        ("/v1/invoiceitems/ii_1", f"line-push:{LINE}:0:7:r2"),
        ("/v1/invoiceitems/ii_1", "line-repair:L:0:7:1"),
        ("/v1/invoices/in_1/finalize", f"invoice-finalize:{INVOICE}"),
        ("/v1/credit_notes", f"credit:{TXN}"),
    ]
    credit = sent.sent[3][3]
    assert (credit["invoice"], credit["amount"], credit["credit_amount"]) == (
        ["in_1"], ["25"], ["25"],
    )  # fmt: skip


def test_reading_a_draft_takes_its_embedded_lines_or_pages_every_item_past_them() -> None:
    def invoice(lines: list[dict[str, Any]], more: bool) -> Any:
        def answer(method: str, path: str) -> dict[str, Any]:
            if path == "/v1/invoiceitems":
                items = [{"id": f"ii_{n}", "object": "invoiceitem", "amount": n} for n in range(12)]
                return {"object": "list", "data": items, "has_more": False, "url": path}
            return {
                "id": "in_1", "object": "invoice", "status": "draft", "total": 66,
                "lines": {"object": "list", "data": lines, "has_more": more, "url": "/x"},
            }  # fmt: skip

        return answer

    embedded = [{"id": "il_1", "object": "line_item", "amount": 5, "invoice_item": "ii_9"}]
    gateway, sent = _gateway(invoice(embedded, False))
    assert gateway.read_draft("in_1") == DraftView("draft", 66, (DraftItem("ii_9", 5),))
    assert len(sent.sent) == 1  # one retrieve, nothing paged
    gateway, sent = _gateway(invoice(embedded, True))
    view = gateway.read_draft("in_1")
    assert isinstance(view, DraftView) and len(view.items) == 12
    assert [p for _, p, _, _ in sent.sent] == ["/v1/invoices/in_1", "/v1/invoiceitems"]
