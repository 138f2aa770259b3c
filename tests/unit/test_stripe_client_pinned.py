"""``StripeGateway`` pinned request by request, without a network.

The gateway is built as production builds it (its own ``StripeClient`` and HTTP client,
from ``StripeSettings``); only the transport under the SDK is fake: ``FakeStripe`` sits
where the ``requests`` session would, answers each method and path from a script, as
Stripe's API would (JSON bodies, Stripe's error envelope, 404 for what it does not know),
and remembers every request: its URL, parameters, idempotency key, API key and timeout.
So what is asserted is what Stripe would receive, what the gateway answers its callers
(ids, views, ``ChargeFailure`` values) and what it counts in
``billing_stripe_requests_total{operation,outcome}`` (the dashboard's series).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any
from urllib.parse import parse_qsl, urlsplit
from uuid import UUID

import pytest
import requests
import stripe
from requests.structures import CaseInsensitiveDict

from adapters.observability.metrics import metrics
from adapters.settings import StripeSettings
from adapters.stripe.client import StripeGateway
from domain.invoice_states import StripeInvoiceView
from domain.periods import Period
from domain.ports import CreditNote, DraftInvoice, ItemRepair, LineItems, LinesUpdate
from domain.pushing import ItemStep, LinePart, LineSet, PushPlan, lines_key
from domain.saga import ChargeFailure
from domain.verification import DraftItem, DraftView

BASE = "http://stripe.test"
LINE, INVOICE, TXN = UUID(int=11), UUID(int=22), UUID(int=33)
OTHER_LINE = UUID(int=12)
PERIOD = Period(datetime(2026, 12, 1, tzinfo=UTC), datetime(2027, 1, 1, tzinfo=UTC))
FINALIZED_AT = 1_800_000_000


# ---------------------------------------------------------------------------------------------
# the fake transport


@dataclass(frozen=True)
class Reply:
    body: Mapping[str, Any]
    status: int = 200
    headers: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Sent:
    """One request as Stripe would receive it: its form or query parameters flattened
    the way Stripe's form encoding writes them (``metadata[line_id]``)."""

    method: str
    path: str
    params: dict[str, str]
    key: str | None


class _Response:
    def __init__(self, reply: Reply) -> None:
        self.content = json.dumps(reply.body).encode()
        self.status_code = reply.status
        self.headers = CaseInsensitiveDict(reply.headers)


class FakeStripe:
    """Stripe's API where the gateway's ``requests`` session would be.

    ``on(method, path, *replies)`` scripts a route: its replies in turn, the last one
    repeated; an exception instead of a reply is raised as the session would raise it.
    A route with no script is answered as Stripe answers an unknown object (404)."""

    def __init__(self) -> None:
        self.routes: dict[tuple[str, str], list[Reply | Exception]] = {}
        self.sent: list[Sent] = []
        self.urls: list[str] = []
        self.timeouts: list[object] = []
        self.api_keys: list[str | None] = []

    def on(self, method: str, path: str, *replies: Reply | Exception) -> None:
        self.routes.setdefault((method, path), []).extend(replies)

    def request(
        self,
        method: str,
        url: str,
        headers: Mapping[str, str] | None = None,
        data: Any = None,
        timeout: object = None,
        **_: Any,
    ) -> _Response:
        parts = urlsplit(url)
        body = data.decode() if isinstance(data, bytes) else (data or "")
        params = dict(parse_qsl(parts.query or body, keep_blank_values=True))
        headers = headers or {}
        self.sent.append(Sent(method.upper(), parts.path, params, headers.get("Idempotency-Key")))
        self.urls.append(url)
        self.timeouts.append(timeout)
        self.api_keys.append(headers.get("Authorization"))
        script = self.routes.get((method.upper(), parts.path))
        if not script:
            return _Response(_error(404, f"No such object: {parts.path}"))
        reply = script.pop(0) if len(script) > 1 else script[0]
        if isinstance(reply, Exception):
            raise reply
        return _Response(reply)

    def close(self) -> None:
        pass

    @property
    def calls(self) -> list[tuple[str, str, str | None]]:
        return [(s.method, s.path, s.key) for s in self.sent]


def _stripe_requests() -> dict[tuple[str, str], float]:
    text = metrics().render().decode()
    pattern = r'^billing_stripe_requests_total\{operation="([^"]*)",outcome="([^"]*)"\} (\S+)$'
    return {(m[1], m[2]): float(m[3]) for m in re.finditer(pattern, text, re.MULTILINE)}


class Stripe:
    """A gateway built from settings, its transport a ``FakeStripe``, and the Stripe
    requests it counted since it was built."""

    def __init__(self, **settings: Any) -> None:
        self.fake = FakeStripe()
        self.gateway = StripeGateway(StripeSettings(api_base=BASE, **settings))
        transport = self.gateway.client._requestor._client
        assert isinstance(transport, stripe.RequestsClient)
        transport._session = self.fake  # type: ignore[assignment]
        self._before = _stripe_requests()

    def on(self, method: str, path: str, *replies: Reply | Exception) -> None:
        self.fake.on(method, path, *replies)

    @property
    def sent(self) -> list[Sent]:
        return self.fake.sent

    def counted(self) -> dict[tuple[str, str], float]:
        """Requests counted by (operation, outcome) since the gateway was built."""
        now = _stripe_requests()
        return {k: n - self._before.get(k, 0) for k, n in now.items() if n != self._before.get(k)}


def _ok(body: Mapping[str, Any]) -> Reply:
    return Reply(body)


def _error(status: int, message: str, **headers: str) -> Reply:
    kind = "invalid_request_error" if status < 500 else "api_error"
    return Reply({"error": {"type": kind, "message": message}}, status, headers)


def _list(url: str, *data: Mapping[str, Any], more: bool = False) -> Reply:
    return Reply({"object": "list", "url": url, "data": list(data), "has_more": more})


def _search(url: str, *data: Mapping[str, Any]) -> Reply:
    return Reply({"object": "search_result", "url": url, "data": list(data), "has_more": False})


def _invoice(status: str, total: int = 0, **more: Any) -> dict[str, Any]:
    return {
        "id": "in_1", "object": "invoice", "status": status, "number": "N-7",
        "total": total, "amount_paid": 0, "attempt_count": 0, "next_payment_attempt": None,
        "created": 1, "status_transitions": {"finalized_at": FINALIZED_AT}, **more,
    }  # fmt: skip


def _item(item_id: str, amount: int = 0, **metadata: str) -> dict[str, Any]:
    return {"id": item_id, "object": "invoiceitem", "amount": amount, "metadata": metadata}


def _view(status: str, total: int, paid: int = 0) -> StripeInvoiceView:
    return StripeInvoiceView(
        status=status,
        number="N-7",
        total=total,
        amount_paid=paid,
        attempt_count=0,
        next_payment_attempt=None,
        at=datetime.fromtimestamp(FINALIZED_AT, UTC),
        source="finalize",
    )


def _failure(result: object) -> ChargeFailure:
    assert isinstance(result, ChargeFailure), result
    return result


# ---------------------------------------------------------------------------------------------
# the gateway's own transport


def test_requests_go_to_the_api_base_with_the_api_key_and_the_timeout_of_the_settings() -> None:
    s = Stripe(api_key="sk_test_pinned", timeout_s=3.5)
    s.on("POST", "/v1/customers", _ok({"id": "cus_A", "object": "customer"}))
    assert s.gateway.customer("acme", look_first=False) == "cus_A"
    assert s.fake.urls == [f"{BASE}/v1/customers"]
    assert s.fake.timeouts == [3.5]
    assert s.fake.api_keys == ["Bearer sk_test_pinned"]


def test_a_server_error_is_sent_once_and_never_retried_by_the_sdk() -> None:
    s = Stripe()
    s.on("POST", "/v1/customers", _error(500, "boom"), _ok({"id": "cus_A"}))
    failure = _failure(s.gateway.customer("acme", look_first=False))
    assert (failure.error_class, failure.retryable, failure.message) == ("http_500", True, "boom")
    assert len(s.sent) == 1
    assert s.counted() == {("customers.create", "http_500"): 1}


def test_a_dropped_connection_is_a_retryable_failure_of_unknown_outcome() -> None:
    s = Stripe()
    s.on("POST", "/v1/customers", requests.ConnectionError("reset by peer"))
    failure = _failure(s.gateway.customer("acme", look_first=False))
    assert (failure.error_class, failure.retryable, failure.may_land_later) == (
        "connection", True, True,
    )  # fmt: skip
    assert len(s.sent) == 1


def test_the_breaker_opens_after_its_failures_and_refuses_the_next_call_unsent() -> None:
    s = Stripe(breaker_fail_max=2)
    s.on("POST", "/v1/customers", _error(503, "down"))
    assert s.gateway.breaker_state() == "closed"
    for _ in range(2):
        assert _failure(s.gateway.customer("acme", look_first=False)).error_class == "http_503"
    assert s.gateway.breaker_state() == "open"
    refused = _failure(s.gateway.customer("acme", look_first=False))
    assert (refused.error_class, refused.retryable, refused.sent) == ("circuit_open", True, False)
    assert len(s.sent) == 2  # the third call never left the process


# ---------------------------------------------------------------------------------------------
# customers


def test_a_customer_is_created_named_and_tagged_with_its_id_under_the_customer_key() -> None:
    s = Stripe()
    s.on("POST", "/v1/customers", _ok({"id": "cus_A", "object": "customer"}))
    assert s.gateway.customer("acme", look_first=False) == "cus_A"
    assert s.sent == [
        Sent("POST", "/v1/customers", {"name": "acme", "metadata[customer_id]": "acme"},
             "customer:acme"),
    ]  # fmt: skip
    assert s.counted() == {("customers.create", "ok"): 1}


def test_looking_first_finds_the_customer_by_its_metadata_and_creates_none() -> None:
    s = Stripe()
    s.on("GET", "/v1/customers/search", _search("/v1/customers/search", {"id": "cus_OLD"}))
    assert s.gateway.customer("acme", look_first=True) == "cus_OLD"
    assert s.sent == [
        Sent("GET", "/v1/customers/search",
             {"query": "metadata['customer_id']:'acme'", "limit": "1"}, None),
    ]  # fmt: skip
    assert s.counted() == {("customers.search", "ok"): 1}


def test_looking_first_and_finding_no_customer_creates_it_under_the_customer_key() -> None:
    s = Stripe()
    s.on("GET", "/v1/customers/search", _search("/v1/customers/search"))
    s.on("POST", "/v1/customers", _ok({"id": "cus_NEW"}))
    assert s.gateway.customer("acme", look_first=True) == "cus_NEW"
    assert s.fake.calls == [
        ("GET", "/v1/customers/search", None),
        ("POST", "/v1/customers", "customer:acme"),
    ]
    assert s.gateway.find_customer("acme") is None


# ---------------------------------------------------------------------------------------------
# draft invoices

DRAFT = DraftInvoice(INVOICE, "acme", "cus_A", "EUR", PERIOD)
DRAFT_PARAMS = {
    "customer": "cus_A",
    "currency": "eur",
    "auto_advance": "false",
    "collection_method": "charge_automatically",
    "pending_invoice_items_behavior": "exclude",
    "description": f"Usage {PERIOD}",
    "metadata[invoice_id]": str(INVOICE),
    "metadata[customer_id]": "acme",
    "metadata[period]": str(PERIOD),
}


def test_a_draft_invoice_never_advances_by_itself_and_takes_no_pending_items() -> None:
    s = Stripe()
    s.on("POST", "/v1/invoices", _ok(_invoice("draft", id="in_NEW")))
    assert s.gateway.draft_invoice(DRAFT, look_first=False) == "in_NEW"
    assert s.sent == [Sent("POST", "/v1/invoices", DRAFT_PARAMS, f"invoice:{INVOICE}")]
    assert s.counted() == {("invoices.create", "ok"): 1}


def test_looking_first_finds_the_draft_by_its_ledger_invoice_id_and_creates_none() -> None:
    s = Stripe()
    s.on("GET", "/v1/invoices/search", _search("/v1/invoices/search", _invoice("draft")))
    assert s.gateway.draft_invoice(DRAFT, look_first=True) == "in_1"
    assert s.sent == [
        Sent("GET", "/v1/invoices/search",
             {"query": f"metadata['invoice_id']:'{INVOICE}'", "limit": "1"}, None),
    ]  # fmt: skip
    assert s.counted() == {("invoices.search", "ok"): 1}


def test_looking_first_and_finding_no_draft_creates_it_under_the_invoice_key() -> None:
    s = Stripe()
    s.on("GET", "/v1/invoices/search", _search("/v1/invoices/search"))
    s.on("POST", "/v1/invoices", _ok(_invoice("draft", id="in_NEW")))
    assert s.gateway.draft_invoice(DRAFT, look_first=True) == "in_NEW"
    assert s.sent[1] == Sent("POST", "/v1/invoices", DRAFT_PARAMS, f"invoice:{INVOICE}")
    assert len(s.sent) == 2


def test_a_failed_draft_creation_is_the_failure_stripe_answered() -> None:
    s = Stripe()
    s.on("POST", "/v1/invoices", _error(400, "No such customer: 'cus_A'"))
    failure = _failure(s.gateway.draft_invoice(DRAFT, look_first=False))
    assert (failure.error_class, failure.retryable) == ("http_400", False)
    assert failure.message == "No such customer: 'cus_A'"


# ---------------------------------------------------------------------------------------------
# finalizing

FINALIZE = "/v1/invoices/in_1/finalize"


def test_finalizing_sends_auto_advance_under_the_finalize_key_and_answers_stripes_view() -> None:
    s = Stripe()
    s.on("POST", FINALIZE, _ok(_invoice("open", 1250)))
    assert s.gateway.finalize_invoice("in_1", INVOICE, look_first=False) == _view("open", 1250)
    assert s.sent == [
        Sent("POST", FINALIZE, {"auto_advance": "true"}, f"invoice-finalize:{INVOICE}")
    ]
    assert s.counted() == {("invoices.finalize", "ok"): 1}


def test_looking_first_at_an_invoice_no_longer_a_draft_reads_it_and_finalizes_nothing() -> None:
    s = Stripe()
    s.on("GET", "/v1/invoices/in_1", _ok(_invoice("paid", 900, amount_paid=900)))
    view = s.gateway.finalize_invoice("in_1", INVOICE, look_first=True)
    assert view == _view("paid", 900, paid=900)
    assert s.fake.calls == [("GET", "/v1/invoices/in_1", None)]
    assert s.counted() == {("invoices.retrieve", "ok"): 1}


def test_looking_first_at_a_draft_finalizes_it() -> None:
    s = Stripe()
    s.on("GET", "/v1/invoices/in_1", _ok(_invoice("draft", 900)))
    s.on("POST", FINALIZE, _ok(_invoice("open", 900)))
    assert s.gateway.finalize_invoice("in_1", INVOICE, look_first=True) == _view("open", 900)
    assert s.fake.calls == [
        ("GET", "/v1/invoices/in_1", None),
        ("POST", FINALIZE, f"invoice-finalize:{INVOICE}"),
    ]


def test_a_400_for_an_invoice_finalized_already_reads_it_so_it_is_recorded_once() -> None:
    s = Stripe()
    s.on("POST", FINALIZE, _error(400, "This invoice is already finalized"))
    s.on("GET", "/v1/invoices/in_1", _ok(_invoice("open", 700)))
    assert s.gateway.finalize_invoice("in_1", INVOICE, look_first=False) == _view("open", 700)
    assert [c[:2] for c in s.fake.calls] == [("POST", FINALIZE), ("GET", "/v1/invoices/in_1")]


def test_a_400_for_an_invoice_still_a_draft_is_the_permanent_failure() -> None:
    s = Stripe()
    s.on("POST", FINALIZE, _error(400, "Invoice has no customer email"))
    s.on("GET", "/v1/invoices/in_1", _ok(_invoice("draft", 700)))
    failure = _failure(s.gateway.finalize_invoice("in_1", INVOICE, look_first=False))
    assert (failure.error_class, failure.retryable) == ("http_400", False)
    assert failure.message == "Invoice has no customer email"
    assert len(s.sent) == 2


@pytest.mark.parametrize(("status", "retryable"), [(404, False), (502, True)])
def test_an_unknown_invoice_or_a_server_error_on_finalize_is_answered_without_a_read(
    status: int, retryable: bool
) -> None:
    s = Stripe()
    s.on("POST", FINALIZE, _error(status, "nope"))
    s.on("GET", "/v1/invoices/in_1", _ok(_invoice("open", 700)))
    failure = _failure(s.gateway.finalize_invoice("in_1", INVOICE, look_first=False))
    assert (failure.error_class, failure.retryable) == (f"http_{status}", retryable)
    assert s.fake.calls == [("POST", FINALIZE, f"invoice-finalize:{INVOICE}")]


# ---------------------------------------------------------------------------------------------
# voiding a purchase's invoice (its grant voided while awaiting payment)

PURCHASE = UUID(int=44)
VOID = "/v1/invoices/in_1/void"


def _voided(view: object, status: str) -> None:
    assert isinstance(view, StripeInvoiceView), view
    assert (view.status, view.source) == (status, "void")


@pytest.mark.parametrize("status", ["open", "uncollectible"])
def test_an_open_purchase_invoice_is_voided_under_its_void_key(status: str) -> None:
    s = Stripe()
    s.on("GET", "/v1/invoices/in_1", _ok(_invoice(status, 900)))
    s.on("POST", VOID, _ok(_invoice("void", 900)))
    _voided(s.gateway.void_purchase_invoice("in_1", PURCHASE), "void")
    assert s.fake.calls == [
        ("GET", "/v1/invoices/in_1", None), ("POST", VOID, f"invoice-void:{PURCHASE}"),
    ]  # fmt: skip
    assert s.counted() == {("invoices.retrieve", "ok"): 1, ("invoices.void", "ok"): 1}


def test_a_draft_purchase_invoice_is_deleted_and_one_gone_counts_as_deleted() -> None:
    s = Stripe()
    s.on("GET", "/v1/invoices/in_1", _ok(_invoice("draft", 900)), _error(404, "No such"))
    s.on("DELETE", "/v1/invoices/in_1", _ok({"id": "in_1", "deleted": True}))
    _voided(s.gateway.void_purchase_invoice("in_1", PURCHASE), "deleted")
    _voided(s.gateway.void_purchase_invoice("in_1", PURCHASE), "deleted")  # lost answer
    assert [c[:2] for c in s.fake.calls] == [
        ("GET", "/v1/invoices/in_1"), ("DELETE", "/v1/invoices/in_1"),
        ("GET", "/v1/invoices/in_1"),
    ]  # fmt: skip


@pytest.mark.parametrize("status", ["paid", "void"])
def test_a_paid_or_void_purchase_invoice_is_answered_as_it_is(status: str) -> None:
    s = Stripe()
    s.on("GET", "/v1/invoices/in_1", _ok(_invoice(status, 900, amount_paid=900)))
    view = s.gateway.void_purchase_invoice("in_1", PURCHASE)
    _voided(view, status)
    assert isinstance(view, StripeInvoiceView) and view.amount_paid == 900
    assert s.fake.calls == [("GET", "/v1/invoices/in_1", None)]


def test_a_void_refused_because_it_was_paid_meanwhile_answers_the_paid_invoice() -> None:
    s = Stripe()
    s.on("GET", "/v1/invoices/in_1", _ok(_invoice("open", 900)),
         _ok(_invoice("paid", 900, amount_paid=900)))  # fmt: skip
    s.on("POST", VOID, _error(400, "Invoices with `paid` payments cannot be voided."))
    _voided(s.gateway.void_purchase_invoice("in_1", PURCHASE), "paid")
    assert [c[:2] for c in s.fake.calls] == [
        ("GET", "/v1/invoices/in_1"), ("POST", VOID), ("GET", "/v1/invoices/in_1"),
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("void", "read", "error_class"),
    [
        (_error(400, "no"), _invoice("open", 900), "http_400"),  # still open: refused
        (_error(502, "down"), None, "http_502"),  # a server error: no second read
    ],
)
def test_a_void_that_fails_is_the_failure(
    void: Reply, read: dict[str, Any] | None, error_class: str
) -> None:
    s = Stripe()
    s.on("GET", "/v1/invoices/in_1", _ok(_invoice("open", 900)), *([_ok(read)] if read else []))
    s.on("POST", VOID, void)
    failure = _failure(s.gateway.void_purchase_invoice("in_1", PURCHASE))
    assert failure.error_class == error_class
    assert len(s.fake.calls) == (3 if read else 2)


def test_a_read_that_fails_other_than_404_is_the_failure() -> None:
    s = Stripe()
    s.on("GET", "/v1/invoices/in_1", _error(500, "down"))
    assert _failure(s.gateway.void_purchase_invoice("in_1", PURCHASE)).error_class == "http_500"


# ---------------------------------------------------------------------------------------------
# reading a draft back


def _draft(*lines: Mapping[str, Any], more: bool = False, total: int = 66) -> Reply:
    embedded = {"object": "list", "url": "/v1/invoices/in_1/lines", "data": list(lines),
                "has_more": more}  # fmt: skip
    return _ok(_invoice("draft", total, lines=embedded))


def test_reading_a_draft_names_each_embedded_line_by_its_invoice_item() -> None:
    s = Stripe()
    s.on("GET", "/v1/invoices/in_1", _draft(
        {"id": "il_1", "amount": 5, "invoice_item": "ii_1"},
        {"id": "il_2", "amount": 6, "invoice_item": None,
         "parent": {"invoice_item_details": {"invoice_item": "ii_2"}}},
        {"id": "il_3", "amount": 7, "invoice_item": "", "parent": None},
        {"id": "il_4", "amount": 8, "parent": {"invoice_item_details": None}},
        {"id": "il_5", "amount": 9, "parent": {"invoice_item_details": {"invoice_item": ""}}},
    ))  # fmt: skip
    items = (
        DraftItem("ii_1", 5),
        DraftItem("ii_2", 6),
        DraftItem("il_3", 7),  # no item behind it: the line's own id
        DraftItem("il_4", 8),
        DraftItem("il_5", 9),
    )
    assert s.gateway.read_draft("in_1") == DraftView("draft", 66, items)
    assert s.fake.calls == [("GET", "/v1/invoices/in_1", None)]
    assert s.counted() == {("invoices.retrieve", "ok"): 1}


@pytest.mark.parametrize(
    "lines",
    [{}, {"lines": None}, {"lines": {"object": "list", "data": None}}],
    ids=["absent", "null", "null_data"],
)
def test_reading_a_draft_without_lines_reads_no_items(lines: dict[str, Any]) -> None:
    s = Stripe()
    s.on("GET", "/v1/invoices/in_1", _ok(_invoice("open", 40, **lines)))
    assert s.gateway.read_draft("in_1") == DraftView("open", 40, ())
    assert len(s.sent) == 1


def test_reading_a_draft_with_more_lines_pages_through_every_item_of_the_invoice() -> None:
    s = Stripe()
    s.on("GET", "/v1/invoices/in_1", _draft({"id": "il_1", "amount": 5}, more=True, total=18))
    s.on(
        "GET",
        "/v1/invoiceitems",
        _list("/v1/invoiceitems", _item("ii_1", 5), _item("ii_2", 6), more=True),
        _list("/v1/invoiceitems", _item("ii_3", 7)),
    )
    view = s.gateway.read_draft("in_1")
    items = (DraftItem("ii_1", 5), DraftItem("ii_2", 6), DraftItem("ii_3", 7))
    assert view == DraftView("draft", 18, items)
    assert [(x.path, x.params) for x in s.sent] == [
        ("/v1/invoices/in_1", {}),
        ("/v1/invoiceitems", {"limit": "100", "invoice": "in_1"}),
        ("/v1/invoiceitems", {"limit": "100", "invoice": "in_1", "starting_after": "ii_2"}),
    ]
    assert s.counted() == {("invoices.retrieve", "ok"): 1, ("invoice_items.list", "ok"): 1}


def test_a_draft_stripe_does_not_know_is_a_permanent_failure() -> None:
    s = Stripe()
    failure = _failure(s.gateway.read_draft("in_GONE"))
    assert (failure.error_class, failure.retryable) == ("http_404", False)
    assert s.counted() == {("invoices.retrieve", "http_404"): 1}


# ---------------------------------------------------------------------------------------------
# pushing a line's items


def _items(*steps: ItemStep, look_first: bool = False, repair: int = 0) -> LineItems:
    plan = PushPlan(7, sum(s.amount for s in steps), steps, (), repair=repair)
    return LineItems(LINE, "api.requests", PERIOD, "cus_A", "in_1", "EUR", plan, look_first)


def _created(chunk: int, amount: int, sequence: int) -> dict[str, str]:
    part = f" (part {chunk + 1})" if chunk else ""
    return {
        "customer": "cus_A",
        "invoice": "in_1",
        "currency": "eur",
        "amount": str(amount),
        "description": f"api.requests {PERIOD}{part}",
        "metadata[line_id]": str(LINE),
        "metadata[chunk]": str(chunk),
        "metadata[sequence]": str(sequence),
    }


def test_a_new_item_is_created_as_planned_on_the_draft_then_set_to_the_lines_total() -> None:
    s = Stripe()
    s.on("POST", "/v1/invoiceitems", _ok(_item("ii_NEW", 200)))
    s.on("POST", "/v1/invoiceitems/ii_NEW", _ok(_item("ii_NEW", 300)))
    ids = s.gateway.set_line_items(_items(ItemStep(0, 300, None, 5, 200, update=True)))
    assert ids == ["ii_NEW"]
    assert s.sent == [
        Sent("POST", "/v1/invoiceitems", _created(0, 200, 5), f"line-item:{LINE}:0"),
        Sent("POST", "/v1/invoiceitems/ii_NEW", {"amount": "300", "metadata[sequence]": "7"},
             f"line-push:{LINE}:0:7"),
    ]  # fmt: skip
    assert s.counted() == {("invoice_items.create", "ok"): 1, ("invoice_items.update", "ok"): 1}


def test_items_are_answered_in_chunk_order_and_only_planned_requests_are_sent() -> None:
    s = Stripe()
    s.on("POST", "/v1/invoiceitems", _ok(_item("ii_B")))
    s.on("POST", "/v1/invoiceitems/ii_C", _ok(_item("ii_C")))
    steps = (
        ItemStep(0, 100, "ii_A"),  # known and already right: nothing sent
        ItemStep(1, 50, None, 7, 50),  # created at its amount, no update
        ItemStep(2, 30, "ii_C", update=True),
    )
    assert s.gateway.set_line_items(_items(*steps)) == ["ii_A", "ii_B", "ii_C"]
    assert s.sent == [
        Sent("POST", "/v1/invoiceitems", _created(1, 50, 7), f"line-item:{LINE}:1"),
        Sent("POST", "/v1/invoiceitems/ii_C", {"amount": "30", "metadata[sequence]": "7"},
             f"line-push:{LINE}:2:7"),
    ]  # fmt: skip


def test_a_repair_push_sets_a_known_item_under_the_repair_key() -> None:
    s = Stripe()
    s.on("POST", "/v1/invoiceitems/ii_A", _ok(_item("ii_A")))
    assert s.gateway.set_line_items(_items(ItemStep(0, 90, "ii_A", update=True), repair=3)) == [
        "ii_A"
    ]
    assert s.fake.calls == [("POST", "/v1/invoiceitems/ii_A", f"line-push:{LINE}:0:7:r3")]


def test_looking_first_reuses_the_item_of_the_same_line_and_chunk_and_creates_none() -> None:
    s = Stripe()
    s.on("GET", "/v1/invoiceitems", _list(
        "/v1/invoiceitems",
        {"id": "ii_BARE", "object": "invoiceitem", "amount": 1},  # no metadata at all
        _item("ii_OTHER_LINE", line_id=str(OTHER_LINE), chunk="1"),
        _item("ii_OTHER_CHUNK", line_id=str(LINE), chunk="0"),
        _item("ii_MINE", line_id=str(LINE), chunk="1"),
        _item("ii_MINE_TOO", line_id=str(LINE), chunk="1"),
    ))  # fmt: skip
    ids = s.gateway.set_line_items(_items(ItemStep(1, 50, None, 7, 50), look_first=True))
    assert ids == ["ii_MINE"]
    assert s.sent == [Sent("GET", "/v1/invoiceitems", {"limit": "100", "invoice": "in_1"}, None)]
    assert s.counted() == {("invoice_items.list", "ok"): 1}


def test_looking_first_and_finding_no_item_creates_it_under_its_creation_key() -> None:
    s = Stripe()
    s.on("GET", "/v1/invoiceitems", _list(
        "/v1/invoiceitems", _item("ii_OTHER", line_id=str(OTHER_LINE), chunk="0"),
    ))  # fmt: skip
    s.on("POST", "/v1/invoiceitems", _ok(_item("ii_NEW")))
    ids = s.gateway.set_line_items(_items(ItemStep(0, 50, None, 7, 50), look_first=True))
    assert ids == ["ii_NEW"]
    assert s.fake.calls == [
        ("GET", "/v1/invoiceitems", None),
        ("POST", "/v1/invoiceitems", f"line-item:{LINE}:0"),
    ]


def test_a_push_stops_at_the_first_failure_and_answers_stripes_failure() -> None:
    s = Stripe()
    s.on("POST", "/v1/invoiceitems", _error(400, "Amount must be positive"))
    steps = (ItemStep(0, 50, None, 7, 50), ItemStep(1, 20, "ii_B", update=True))
    failure = _failure(s.gateway.set_line_items(_items(*steps)))
    assert (failure.error_class, failure.retryable) == ("http_400", False)
    assert failure.message == "Amount must be positive"
    assert len(s.sent) == 1
    assert s.counted() == {("invoice_items.create", "http_400"): 1}


# ---------------------------------------------------------------------------------------------
# repairs, deletions and credit notes


def test_each_repair_sets_its_item_to_its_amount_under_its_own_key() -> None:
    s = Stripe()
    s.on("POST", "/v1/invoiceitems/ii_A", _ok(_item("ii_A")))
    s.on("POST", "/v1/invoiceitems/ii_B", _ok(_item("ii_B")))
    repairs = [
        ItemRepair("ii_A", 300, 7, "line-repair:a"),
        ItemRepair("ii_B", 40, 8, "line-repair:b"),
    ]
    assert s.gateway.repair_items(repairs) is None
    assert s.sent == [
        Sent("POST", "/v1/invoiceitems/ii_A", {"amount": "300", "metadata[sequence]": "7"},
             "line-repair:a"),
        Sent("POST", "/v1/invoiceitems/ii_B", {"amount": "40", "metadata[sequence]": "8"},
             "line-repair:b"),
    ]  # fmt: skip
    assert s.counted() == {("invoice_items.update", "ok"): 2}


def test_a_failed_repair_is_answered_and_the_repairs_after_it_are_not_sent() -> None:
    s = Stripe()
    s.on("POST", "/v1/invoiceitems/ii_A", _error(503, "unavailable"))
    repairs = [ItemRepair("ii_A", 300, 7, "k1"), ItemRepair("ii_B", 40, 8, "k2")]
    failure = _failure(s.gateway.repair_items(repairs))
    assert (failure.error_class, failure.retryable) == ("http_503", True)
    assert s.fake.calls == [("POST", "/v1/invoiceitems/ii_A", "k1")]


def test_deleting_an_item_sends_the_delete_under_the_given_key() -> None:
    s = Stripe()
    s.on("DELETE", "/v1/invoiceitems/ii_A", _ok({"id": "ii_A", "deleted": True}))
    assert s.gateway.delete_item("ii_A", "delete:txn") is None
    assert s.fake.calls == [("DELETE", "/v1/invoiceitems/ii_A", "delete:txn")]
    assert s.counted() == {("invoice_items.delete", "ok"): 1}


def test_deleting_an_item_already_gone_counts_as_deleted() -> None:
    s = Stripe()  # Stripe answers 404: no such invoice item
    assert s.gateway.delete_item("ii_GONE", "delete:txn") is None
    assert s.counted() == {("invoice_items.delete", "http_404"): 1}


@pytest.mark.parametrize(("status", "retryable"), [(400, False), (500, True)])
def test_a_delete_stripe_refuses_or_cannot_answer_is_the_failure(
    status: int, retryable: bool
) -> None:
    s = Stripe()
    s.on("DELETE", "/v1/invoiceitems/ii_A", _error(status, "no"))
    failure = _failure(s.gateway.delete_item("ii_A", "delete:txn"))
    assert (failure.error_class, failure.retryable) == (f"http_{status}", retryable)


def _note(after_payment: bool, memo: str = "reversal") -> CreditNote:
    return CreditNote(INVOICE, "in_1", TXN, 25, after_payment=after_payment, memo=memo)


NOTE_PARAMS = {
    "invoice": "in_1",
    "amount": "25",
    "memo": "reversal",
    "metadata[invoice_id]": str(INVOICE),
    "metadata[transaction_id]": str(TXN),
}


def test_a_credit_note_before_payment_reduces_the_invoice_under_the_transactions_key() -> None:
    s = Stripe()
    s.on("POST", "/v1/credit_notes", _ok({"id": "cn_A", "object": "credit_note"}))
    assert s.gateway.credit_note(_note(after_payment=False)) == "cn_A"
    assert s.sent == [Sent("POST", "/v1/credit_notes", NOTE_PARAMS, f"credit:{TXN}")]
    assert s.counted() == {("credit_notes.create", "ok"): 1}


def test_a_credit_note_after_payment_credits_the_customers_balance() -> None:
    s = Stripe()
    s.on("POST", "/v1/credit_notes", _ok({"id": "cn_A", "object": "credit_note"}))
    assert s.gateway.credit_note(_note(after_payment=True)) == "cn_A"
    assert s.sent == [
        Sent("POST", "/v1/credit_notes", {**NOTE_PARAMS, "credit_amount": "25"}, f"credit:{TXN}")
    ]


def test_a_credit_notes_memo_is_cut_to_stripes_500_characters() -> None:
    s = Stripe()
    s.on("POST", "/v1/credit_notes", _ok({"id": "cn_A", "object": "credit_note"}))
    assert s.gateway.credit_note(_note(after_payment=False, memo="m" * 499 + "XYZ")) == "cn_A"
    assert s.sent[0].params["memo"] == "m" * 499 + "X"


def test_a_refused_credit_note_is_the_failure() -> None:
    s = Stripe()
    s.on("POST", "/v1/credit_notes", _error(400, "Amount exceeds the invoice"))
    failure = _failure(s.gateway.credit_note(_note(after_payment=False)))
    assert (failure.error_class, failure.message) == ("http_400", "Amount exceeds the invoice")


# ---------------------------------------------------------------------------------------------
# listings (the audit's reads)


def test_a_customers_invoice_items_are_listed_across_pages_as_plain_dicts() -> None:
    s = Stripe()
    s.on(
        "GET",
        "/v1/invoiceitems",
        _list("/v1/invoiceitems", _item("ii_1", 5), more=True),
        _list("/v1/invoiceitems", _item("ii_2", 6)),
    )
    found = list(s.gateway.invoice_items("cus_A"))
    assert found == [_item("ii_1", 5), _item("ii_2", 6)]
    assert [x.params for x in s.sent] == [
        {"limit": "100", "customer": "cus_A"},
        {"limit": "100", "customer": "cus_A", "starting_after": "ii_1"},
    ]
    assert s.counted() == {("invoice_items.list", "ok"): 1}


def test_every_invoice_item_is_listed_when_no_customer_or_invoice_is_named() -> None:
    s = Stripe()
    s.on("GET", "/v1/invoiceitems", _list("/v1/invoiceitems", _item("ii_1", 5)))
    assert list(s.gateway.invoice_items()) == [_item("ii_1", 5)]
    assert [x.params for x in s.sent] == [{"limit": "100"}]


def test_a_customers_invoices_are_listed_across_pages_as_plain_dicts() -> None:
    s = Stripe()
    first, second = _invoice("open", 5, id="in_A"), _invoice("paid", 6, id="in_B")
    s.on(
        "GET",
        "/v1/invoices",
        _list("/v1/invoices", first, more=True),
        _list("/v1/invoices", second),
    )
    assert list(s.gateway.invoices("cus_A")) == [first, second]
    assert [x.params for x in s.sent] == [
        {"limit": "100", "customer": "cus_A"},
        {"limit": "100", "customer": "cus_A", "starting_after": "in_A"},
    ]
    assert s.counted() == {("invoices.list", "ok"): 1}


def test_every_invoice_is_listed_when_no_customer_is_named() -> None:
    s = Stripe()
    s.on("GET", "/v1/invoices", _list("/v1/invoices", _invoice("open", 5)))
    assert [i["id"] for i in s.gateway.invoices()] == ["in_1"]
    assert [x.params for x in s.sent] == [{"limit": "100"}]


def test_the_calls_made_directly_create_and_finalize_without_looking_first() -> None:
    s = Stripe()
    s.on("POST", "/v1/customers", _ok({"id": "cus_A", "object": "customer"}))
    s.on("POST", "/v1/invoices", _ok(_invoice("draft")))
    s.on("POST", FINALIZE, _ok(_invoice("open", 10)))
    assert s.gateway.create_customer("acme") == "cus_A"
    assert s.gateway.create_draft_invoice(DRAFT) == "in_1"
    assert s.gateway.finalize("in_1", INVOICE) == _view("open", 10)
    assert [c[:2] for c in s.fake.calls] == [
        ("POST", "/v1/customers"),
        ("POST", "/v1/invoices"),
        ("POST", FINALIZE),
    ]


# ---------------------------------------------------------------------------------------------
# a draft's lines: their ids, and setting them together


def _line(line_id: str, item: str | None, **more: Any) -> dict[str, Any]:
    parent = {"invoice_item_details": {"invoice_item": item}} if item else None
    return {"id": line_id, "object": "line_item", "amount": 1, "parent": parent, **more}


def test_a_drafts_line_items_are_read_page_by_page_each_named_by_its_invoice_item() -> None:
    s = Stripe()
    s.on(
        "GET",
        "/v1/invoices/in_1/lines",
        _list("/v1/invoices/in_1/lines", _line("il_A", "ii_1"), _line("il_B", None), more=True),
        _list("/v1/invoices/in_1/lines", _line("il_C", "ii_3")),
    )
    assert s.gateway.line_items("in_1") == {"ii_1": "il_A", "ii_3": "il_C"}  # il_B: no item
    assert [(x.method, x.path, x.params) for x in s.sent] == [
        ("GET", "/v1/invoices/in_1/lines", {"limit": "100"}),
        ("GET", "/v1/invoices/in_1/lines", {"limit": "100", "starting_after": "il_B"}),
    ]
    assert s.counted() == {("invoices.list_lines", "ok"): 2}


def test_an_empty_page_of_lines_ends_the_reading() -> None:
    s = Stripe()
    s.on("GET", "/v1/invoices/in_1/lines", _list("/v1/invoices/in_1/lines", more=True))
    assert s.gateway.line_items("in_1") == {}
    assert len(s.sent) == 1


def test_a_drafts_lines_are_set_in_one_request_under_the_invoices_key() -> None:
    s = Stripe()
    s.on("POST", "/v1/invoices/in_1/update_lines", _ok(_invoice("draft", 340)))
    parts = (
        LinePart(LINE, PushPlan(7, 300, (), ()), (LineSet(LINE, 0, "il_A", 300, 7),)),
        LinePart(OTHER_LINE, PushPlan(8, 40, (), ()), (LineSet(OTHER_LINE, 1, "il_B", 40, 8),)),
    )
    assert s.gateway.update_lines(LinesUpdate(INVOICE, "in_1", parts)) is None
    assert s.sent == [
        Sent("POST", "/v1/invoices/in_1/update_lines", {
            "lines[0][id]": "il_A", "lines[0][amount]": "300",
            "lines[0][metadata][sequence]": "7",
            "lines[1][id]": "il_B", "lines[1][amount]": "40",
            "lines[1][metadata][sequence]": "8",
        }, lines_key(INVOICE, parts)),
    ]  # fmt: skip
    assert s.counted() == {("invoices.update_lines", "ok"): 1}


def test_a_refused_bulk_update_is_a_permanent_failure_and_a_503_a_retryable_one() -> None:
    s = Stripe()
    s.on(
        "POST",
        "/v1/invoices/in_1/update_lines",
        _error(400, "This invoice is no longer editable"),
        _error(503, "unavailable"),
    )
    part = LinePart(LINE, PushPlan(7, 3, (), ()), (LineSet(LINE, 0, "il_A", 3, 7),))
    update = LinesUpdate(INVOICE, "in_1", (part,))
    refused = _failure(s.gateway.update_lines(update))
    assert (refused.retryable, refused.error_class) == (False, "http_400")
    assert _failure(s.gateway.update_lines(update)).retryable
    assert s.counted() == {
        ("invoices.update_lines", "http_400"): 1,
        ("invoices.update_lines", "http_503"): 1,
    }
