"""``POST /v1/invoices/{id}/add_lines`` through the real SDK: a draft's new lines made in
one request as invoice items with their metadata, the invoice answered with its first
page of lines; the key replayed, refused with other parameters; nothing made on a
finalized invoice (the refusal saved under its key) nor when one line is wrong; a
pending item assigned by its ``ii_`` id; held and executed late like the other requests
that set an amount."""

from __future__ import annotations

from typing import Any

import pytest
import stripe

from infra.stripe_emulator import StripeEmulator

from .support import draft, executions, header, item_params, new_customer, wait_until


def _lines(*amounts: int, line: str = "l") -> dict[str, Any]:
    return {
        "lines": [
            {"amount": a, "description": f"{line} {n}", "metadata": {"line_id": f"{line}{n}"}}
            for n, a in enumerate(amounts)
        ]
    }


def _add(
    client: stripe.StripeClient, invoice: str, params: dict[str, Any], key: str | None = None
) -> stripe.Invoice:
    options: dict[str, Any] = {} if key is None else {"idempotency_key": key}
    return client.v1.invoices.add_lines(invoice, params=params, options=options)  # type: ignore[arg-type]


def test_a_drafts_new_lines_are_made_in_one_request_and_answered_as_its_lines(
    emulator: StripeEmulator, client: stripe.StripeClient
) -> None:
    invoice = draft(client, new_customer(client).id)
    answer = _add(client, invoice.id, _lines(100, 250, 7), key="add-1")
    assert answer.object == "invoice" and answer.status == "draft"
    assert answer.total == 357
    shown = {ln.metadata["line_id"]: ln for ln in answer.lines.data}  # type: ignore[index]
    assert set(shown) == {"l0", "l1", "l2"}
    for ln in shown.values():
        assert ln.id.startswith("il_") and str(ln.invoice_item).startswith("ii_")
    items = client.v1.invoice_items.list(params={"invoice": invoice.id}).data
    assert {i.id for i in items} == {str(ln.invoice_item) for ln in shown.values()}
    assert {i.metadata["line_id"]: i.amount for i in items} == {"l0": 100, "l1": 250, "l2": 7}  # type: ignore[index]
    listed = client.v1.invoices.line_items.list(invoice.id).data
    assert {ln.id for ln in listed} == {ln.id for ln in shown.values()}
    assert len(executions(emulator, "add-1")) == 1


def test_its_key_replays_the_answer_and_refuses_other_parameters(
    emulator: StripeEmulator, client: stripe.StripeClient
) -> None:
    invoice = draft(client, new_customer(client).id)
    first = _add(client, invoice.id, _lines(100, 200), key="add-k")
    again = _add(client, invoice.id, _lines(100, 200), key="add-k")
    assert header(again, "Idempotent-Replayed") == "true"
    assert [ln.id for ln in again.lines.data] == [ln.id for ln in first.lines.data]
    with pytest.raises(stripe.IdempotencyError) as refused:
        _add(client, invoice.id, _lines(100), key="add-k")  # the same key, fewer lines
    assert refused.value.http_status == 400
    assert refused.value.error is not None and refused.value.error.type == "idempotency_error"
    assert client.v1.invoices.retrieve(invoice.id).total == 300  # made once
    assert len(executions(emulator, "add-k")) == 1


def test_a_finalized_invoice_takes_no_new_lines_and_the_refusal_is_replayed(
    emulator: StripeEmulator, client: stripe.StripeClient
) -> None:
    invoice = draft(client, new_customer(client).id)
    _add(client, invoice.id, _lines(100))
    client.v1.invoices.finalize_invoice(invoice.id)
    for _ in range(2):
        with pytest.raises(stripe.InvalidRequestError, match="no longer editable"):
            _add(client, invoice.id, _lines(5, line="late"), key="add-final")
    assert [r["outcome"] for r in emulator.requests()][-2:] == ["executed", "replayed"]
    assert client.v1.invoices.retrieve(invoice.id).total == 100
    assert len(client.v1.invoice_items.list(params={"invoice": invoice.id}).data) == 1


def test_one_wrong_line_makes_none_and_a_pending_item_is_assigned_by_its_own_id(
    client: stripe.StripeClient,
) -> None:
    customer = new_customer(client).id
    invoice = draft(client, customer)
    pending = client.v1.invoice_items.create(params=item_params(customer, "txn-pending"))
    wrong = {"lines": [{"amount": 10}, {"invoice_item": "il_not_an_item"}]}
    with pytest.raises(stripe.InvalidRequestError) as missing:
        _add(client, invoice.id, wrong)
    assert missing.value.code == "resource_missing"
    with pytest.raises(stripe.InvalidRequestError) as no_amount:
        _add(client, invoice.id, {"lines": [{"amount": 10}, {"description": "no amount"}]})
    assert no_amount.value.param == "lines[1][amount]"
    assert client.v1.invoices.retrieve(invoice.id).total == 0  # nothing made
    answer = _add(client, invoice.id, {"lines": [{"amount": 10}, {"invoice_item": pending.id}]})
    assert answer.total == 10 + 1250
    assert client.v1.invoice_items.retrieve(pending.id).invoice == invoice.id
    with pytest.raises(stripe.InvalidRequestError, match="already on an invoice"):
        _add(client, invoice.id, {"lines": [{"invoice_item": pending.id}]})


def test_new_lines_are_held_and_executed_late_like_an_amount_update(
    emulator: StripeEmulator, client: stripe.StripeClient
) -> None:
    invoice = draft(client, new_customer(client).id)
    emulator.set_faults(late_execute_next=1, late_execute_s=0.3)
    with pytest.raises(stripe.APIConnectionError):  # the client hears nothing
        _add(client, invoice.id, _lines(40, 2), key="add-late")
    with pytest.raises(stripe.APIError) as in_use:  # its key in flight meanwhile
        _add(client, invoice.id, _lines(40, 2), key="add-late")
    assert in_use.value.http_status == 409
    wait_until(lambda: bool(executions(emulator, "add-late")), what="the late add_lines")
    again = _add(client, invoice.id, _lines(40, 2), key="add-late")
    assert header(again, "Idempotent-Replayed") == "true" and again.total == 42
    assert len(client.v1.invoice_items.list(params={"invoice": invoice.id}).data) == 2
