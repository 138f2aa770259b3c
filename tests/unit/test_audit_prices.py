"""``domain.audit_prices``: every amount recomputed from the price book version its
Metered names, from the events as they are stored."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any
from uuid import UUID

import orjson
import pytest

from domain.audit import Finding, TxnAudit
from domain.audit_prices import check_prices
from domain.contract import Contract, ContractTerms
from domain.price_book import PRICE_BOOK_ID, PriceBook
from domain.pricing import Price, PriceList
from domain.transaction import BillingTransaction, Source
from tests.fast.fakes import memory_ledger, usage

AT = datetime(2026, 12, 3, tzinfo=UTC)
BOOK = str(PRICE_BOOK_ID)
MAPPER = memory_ledger().mapper


def _book() -> PriceBook:
    book = PriceBook.start(PriceList({"api": Price(Decimal("0.001"), "USD")}))
    book.publish(
        PriceList(
            {
                "api": Price(Decimal("0.002"), "USD"),
                "gpu": Price(Decimal("2.5"), "EUR"),
                "tokens": Price(Decimal("2.50"), "USD", per=1_000_000),
            }
        ),
        AT,
    )
    return book


def _stored(event: Any) -> dict[str, Any]:
    """The event's state as the audit reads it: the stored JSON, decoded."""
    data: dict[str, Any] = orjson.loads(MAPPER.to_stored_event(event).state)
    return data


def _versions(book: PriceBook) -> dict[tuple[str | None, int], Any]:
    published = [e for e in book.collect_events() if isinstance(e, PriceBook.Published)]
    return {(BOOK, e.number): _stored(e)["meters"] for e in published}


VERSIONS = _versions(_book())


def _metered_data(
    usage_id: str, occurred_at: datetime, meter: str = "api", quantity: str = "1000", **forged: Any
) -> dict[str, Any]:
    """A transaction priced by ``_book()`` as the audit folds its stored Metered (with
    any field replaced, as a forger would)."""
    record = usage(usage_id, quantity=quantity, meter=meter)
    record = record.model_copy(update={"occurred_at": occurred_at})
    txn = BillingTransaction.from_usage(record, _book().schedule, Source("usage", 0, 1))
    data = _stored(txn.pending_events[0])
    for key in ("quantity", "timestamp", "amount"):
        data[key] = data[key]["_data_"]
    data.update(forged)
    data["id"] = str(txn.id)
    return data


def _metered(usage_id: str, occurred_at: datetime, **kw: Any) -> TxnAudit:
    data = _metered_data(usage_id, occurred_at, **kw)
    return TxnAudit.metered(data.pop("id"), data)


def _problems(*txns: TxnAudit) -> list[str]:
    findings = check_prices(txns, VERSIONS)
    assert {f.kind for f in findings} <= {"price"}
    assert [f.subject for f in findings] == [t.transaction_id for t in txns][: len(findings)]
    return [f.detail for f in findings]


def test_the_fold_keeps_the_version_a_metered_event_names() -> None:
    before, after = _metered("b", AT - timedelta(seconds=1)), _metered("a", AT)
    assert before.priced_by == (BOOK, 1)
    assert after.priced_by == (BOOK, 2)
    assert (before.amount, after.amount) == (Decimal(100), Decimal(200))


def test_amounts_priced_by_the_versions_they_name_are_clean() -> None:
    txns = [
        _metered("b", AT - timedelta(seconds=1)),
        _metered("a", AT),
        _metered("g", AT, meter="gpu", quantity="3"),
        _metered("t", AT, meter="tokens", quantity="2000"),
    ]
    assert txns[-1].amount == Decimal("0.5")  # 2,000 x 2.50 USD / 1,000,000: the per counts
    assert check_prices(txns, VERSIONS) == []


def test_a_metered_event_naming_a_version_that_does_not_exist_is_a_finding() -> None:
    forged = _metered("a", AT, price_version=7)
    assert check_prices([forged], VERSIONS) == [
        Finding("price", forged.transaction_id, f"priced by price book {BOOK} version 7, which"
                " does not exist"),
    ]  # fmt: skip


def test_a_metered_event_naming_another_book_is_a_finding() -> None:
    other = UUID(int=7)
    forged = _metered("a", AT, price_book_id={"_type_": "uuid_hex", "_data_": other.hex})
    assert _problems(forged) == [f"priced by price book {other} version 2, which does not exist"]


def test_an_amount_other_than_its_versions_price_times_quantity_is_a_finding() -> None:
    # Priced at version 1's price but naming version 2 (or the amount edited).
    forged = _metered("a", AT, amount="100")
    assert _problems(forged) == [
        f"amount 1.00 USD, but price book {BOOK} version 2 prices 1000 of 'api' at 2.00 USD"
    ]
    assert _problems(_metered("b", AT, amount="200.0")) == []  # the same value, written so


def test_a_version_naming_a_meter_it_does_not_price_is_a_finding() -> None:
    forged = _metered("g", AT, meter="gpu", quantity="3", price_version=1)
    assert _problems(forged) == [
        f"priced by price book {BOOK} version 1, which has no price for meter 'gpu'"
    ]


def test_a_currency_other_than_the_versions_is_a_finding() -> None:
    forged = _metered("a", AT, currency="EUR")
    assert _problems(forged) == [f"in EUR, but price book {BOOK} version 2 prices 'api' in USD"]


def test_a_quantity_the_version_cannot_price_is_a_finding() -> None:
    forged = replace(_metered("a", AT), quantity="1" + "0" * 40)
    (problem,) = _problems(forged)
    assert problem.startswith(
        f"price book {BOOK} version 2 cannot price {'1' + '0' * 40} of 'api': amount_too_large"
    )


def test_a_metered_event_from_before_price_books_is_not_checked_against_a_version() -> None:
    data = _stored_old(_metered("a", AT, amount="12345"))
    assert TxnAudit.metered("t", data).priced_by is None
    assert check_prices([TxnAudit.metered("t", data)], {}) == []
    forged = _metered("f", AT, amount="1")
    assert [f.subject for f in check_prices([TxnAudit.metered("t", data), forged], VERSIONS)] == [
        forged.transaction_id  # the ones after it are still checked
    ]


def _stored_old(txn: TxnAudit) -> dict[str, Any]:
    """A Metered event's data as stored before price books: no book, no version."""
    return {
        "customer_id": txn.customer_id,
        "usage_id": txn.usage_id,
        "meter": txn.meter,
        "quantity": txn.quantity,
        "amount": str(txn.amount),
        "currency": txn.currency,
        "timestamp": txn.metered_at,
    }


@pytest.mark.parametrize("number", [0, 3])
def test_only_the_versions_the_book_published_exist(number: int) -> None:
    assert _problems(_metered("a", AT, price_version=number)) == [
        f"priced by price book {BOOK} version {number}, which does not exist"
    ]


def test_a_version_published_after_the_transaction_was_recorded_is_a_finding() -> None:
    early = replace(_metered("a", AT), before_its_version=True)
    assert check_prices([early], VERSIONS) == [
        Finding("price", early.transaction_id, f"priced by price book {BOOK} version 2,"
                " published after it was recorded"),
    ]  # fmt: skip
    # The initial version is named by workers that ran before migrate started the book.
    assert (
        _problems(replace(_metered("b", AT - timedelta(seconds=1)), before_its_version=True)) == []
    )
    assert _problems(_metered("a", AT)) == []


def test_the_fold_says_whether_the_version_was_published_before_the_transaction() -> None:
    data = _metered_data("a", AT)  # version 2
    data.pop("id")
    assert TxnAudit.metered("t", data).before_its_version is False  # not asked
    assert TxnAudit.metered("t", data, {(BOOK, 1), (BOOK, 2)}).before_its_version is False
    assert TxnAudit.metered("t", data, {(BOOK, 1)}).before_its_version is True
    old = _stored_old(_metered("b", AT))  # names no version: nothing to be before
    assert TxnAudit.metered("t", old, set()).before_its_version is False


# ---------------------------------------------------------------------------------------------
# Contracts: each contract-priced amount recomputed from the contract version it names


def _contract() -> Contract:
    listed = _book().schedule.latest.prices
    contract = Contract("acme")
    contract.set(ContractTerms.from_toml('[meters.api]\ndiscount = "25"\n', listed), AT)
    replacement = '[meters.api]\nunit_price = "0.0005"\ncurrency = "USD"\n'
    contract.set(ContractTerms.from_toml(replacement, listed), AT + timedelta(days=1))
    return contract


def _contracts() -> dict[tuple[str, int], Any]:
    contract = _contract()
    sets = [e for e in contract.collect_events() if isinstance(e, Contract.Set)]
    return {(str(contract.id), e.number): _stored(e) for e in sets}


def _contract_metered(usage_id: str, occurred_at: datetime, **forged: Any) -> TxnAudit:
    record = usage(usage_id, quantity="1000", meter="api")
    record = record.model_copy(update={"occurred_at": occurred_at})
    schedule = _book().schedule.with_contracts({"acme": _contract().schedule})
    txn = BillingTransaction.from_usage(record, schedule, Source("usage", 0, 1))
    data = _stored(txn.pending_events[0])
    for key in ("quantity", "timestamp", "amount"):
        data[key] = data[key]["_data_"]
    data.update(forged)
    return TxnAudit.metered(str(txn.id), data)


def _contract_problems(*txns: TxnAudit) -> list[str]:
    return [f.detail for f in check_prices(txns, VERSIONS, _contracts())]


def test_contract_priced_amounts_recompute_from_the_contract_version_they_name() -> None:
    discounted = _contract_metered("c1", AT)  # 1000 x 0.002 USD less 25 %: 150 cents
    replaced = _contract_metered("c2", AT + timedelta(days=2))  # 1000 x 0.0005: 50 cents
    assert (discounted.contract_version, discounted.amount) == (1, Decimal(150))
    assert (replaced.contract_version, replaced.amount) == (2, Decimal(50))
    assert _contract_problems(discounted, replaced) == []


def test_a_forged_amount_or_contract_version_is_a_finding() -> None:
    problems = _contract_problems(
        _contract_metered("f1", AT, amount="200"),  # the list price, under the contract's name
        _contract_metered("f2", AT, contract_version=7),  # a version that was never set
        _contract_metered("f3", AT, contract_version=2),  # the other version's price
        _contract_metered("f4", AT, customer_id="beta"),  # another customer's contract
    )
    assert len(problems) == 4, problems
    assert "amount 2.00 USD, but contract version 1 of acme" in problems[0]
    assert "at 1.50 USD" in problems[0]
    assert problems[1] == "priced by contract version 7 of acme, which does not exist"
    assert "contract version 2 of acme (on price book" in problems[2]
    assert problems[3] == "priced by contract version 1 of beta, which does not exist"


def test_a_contract_version_set_after_the_transaction_was_recorded_is_a_finding() -> None:
    record = _contract_metered("late", AT)
    data = {"customer_id": "acme", "contract_version": 1}
    fields = {**_metered_data("late", AT), **data}
    early = TxnAudit.metered(record.transaction_id, fields, VERSIONS, ())  # no contract yet
    early.amount = record.amount
    assert early.before_its_contract
    assert _contract_problems(early) == [
        "priced by contract version 1 of acme, set after it was recorded"
    ]
