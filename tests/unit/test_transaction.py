"""``BillingTransaction``: deterministic identity, pricing, and the lifecycle in DESIGN.md."""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest
from pydantic import ValidationError

from domain.errors import IllegalTransition, InvalidUsage, UnknownMeter
from domain.ids import account_id, transaction_id
from domain.price_book import PRICE_BOOK_ID, PriceBook
from domain.pricing import Price, PriceList
from domain.transaction import BillingTransaction, Source, TxnState
from domain.usage import UsageRecord

PRICES = PriceList(
    {
        "api.requests": Price(Decimal("0.001"), "USD"),
        "gpt-4o.input_tokens": Price(Decimal("2.50"), "USD", 1_000_000),
    }
)
SOURCE = Source(topic="usage", partition=3, offset=42)
AT = datetime(2026, 12, 2, 10, 15, tzinfo=UTC)
RETRY_AT = AT + timedelta(seconds=30)
THREE_DAYS = timedelta(days=3)
TICK = timedelta(microseconds=1)
ACCOUNT = account_id("acme", "USD")


def _record(
    usage_id: str = "req-1",
    customer_id: str = "acme",
    meter: str = "api.requests",
    quantity: str = "1500",
    currency: str | None = None,
) -> UsageRecord:
    return UsageRecord(
        usage_id=usage_id,
        customer_id=customer_id,
        meter=meter,
        quantity=Decimal(quantity),
        occurred_at=AT,
        currency=currency,
    )


def _metered(**record: Any) -> BillingTransaction:
    return BillingTransaction.from_usage(_record(**record), PRICES, SOURCE)


def _event_names(txn: BillingTransaction) -> list[str]:
    return [type(e).__name__ for e in txn.pending_events]


# ---------------------------------------------------------------------------------------------
# identity


def test_the_same_customer_and_usage_id_always_give_the_same_transaction_id() -> None:
    first = _metered(quantity="1500")
    redelivered = _metered(quantity="9999")  # even with another payload: the key decides
    assert first.id == redelivered.id == transaction_id("acme", "req-1")


@pytest.mark.parametrize(
    ("customer_id", "usage_id"),
    [("acme", "req-2"), ("globex", "req-1"), ("ACME", "req-1"), ("acme", "REQ-1")],
)
def test_a_different_customer_or_usage_id_gives_a_different_transaction_id(
    customer_id: str, usage_id: str
) -> None:
    other = _metered(customer_id=customer_id, usage_id=usage_id)
    assert other.id != _metered().id


def test_a_customer_id_cannot_contain_the_key_separator_so_two_customers_never_share_an_id() -> (
    None
):
    # "acme:eu"/"req-1" and "acme"/"eu:req-1" would both key as "acme:eu:req-1".
    with pytest.raises(ValidationError, match="customer_id"):
        _record(customer_id="acme:eu", usage_id="req-1")
    two = _record(customer_id="acme", usage_id="eu:req-1")  # ':' is fine in a usage id
    assert transaction_id(two.customer_id, two.usage_id) == transaction_id("acme", "eu:req-1")


def test_no_usage_key_can_name_a_customer_account() -> None:
    # Accounts live in a namespace of their own: a customer called "account" with usage
    # "x:USD" must not collide with the account of customer "x" in USD.
    assert transaction_id("account", "x:USD") != account_id("x", "USD")


# ---------------------------------------------------------------------------------------------
# Metered


def test_from_usage_prices_the_record_and_records_its_source() -> None:
    txn = _metered(quantity="1500")
    assert (txn.customer_id, txn.usage_id, txn.meter) == ("acme", "req-1", "api.requests")
    assert txn.quantity == Decimal(1500)
    assert (txn.unit_price, txn.per, txn.currency) == (Decimal("0.001"), 1, "USD")
    assert txn.amount == 150  # 1,500 x 0.001 USD = 1.50 USD = 150 cents
    assert txn.occurred_at == AT
    assert txn.source == "usage/3@42"
    assert txn.state is TxnState.METERED
    assert (txn.account_id, txn.attempts, txn.compensation_reason) == (None, 0, None)
    assert _event_names(txn) == ["Metered"]


def test_from_usage_names_the_initial_version_when_given_a_bare_price_list() -> None:
    txn = _metered()
    assert (txn.price_book_id, txn.price_version) == (PRICE_BOOK_ID, 1)
    assert txn.pending_events[0].price_version == 1  # type: ignore[attr-defined]


def _at(moment: datetime, usage_id: str = "req-1") -> UsageRecord:
    return _record(usage_id=usage_id).model_copy(update={"occurred_at": moment})


def test_from_usage_prices_by_the_version_in_force_when_the_usage_occurred() -> None:
    book = PriceBook.start(PRICES)
    book.publish(PriceList({"api.requests": Price(Decimal("0.002"), "USD")}), AT)
    book.publish(PriceList({"api.requests": Price(Decimal("0.004"), "EUR")}), AT + THREE_DAYS)
    schedule = book.schedule
    before = BillingTransaction.from_usage(_at(AT - TICK), schedule, SOURCE)
    at = BillingTransaction.from_usage(_at(AT), schedule, SOURCE)
    later = BillingTransaction.from_usage(_at(AT + THREE_DAYS), schedule, SOURCE)
    assert (before.price_version, before.unit_price, before.amount) == (1, Decimal("0.001"), 150)
    assert (at.price_version, at.unit_price, at.amount, at.currency) == (
        2, Decimal("0.002"), 300, "USD",
    )  # fmt: skip
    assert (later.price_version, later.unit_price, later.amount, later.currency) == (
        3, Decimal("0.004"), 600, "EUR",
    )  # fmt: skip
    assert {before.price_book_id, at.price_book_id, later.price_book_id} == {PRICE_BOOK_ID}
    fields = BillingTransaction.metered_fields(_at(AT), schedule, SOURCE)
    assert list(fields)[-3:] == ["price_book_id", "price_version", "contract_version"]
    assert (fields["price_book_id"], fields["price_version"]) == (PRICE_BOOK_ID, 2)


def test_from_usage_rejects_a_meter_the_version_in_force_does_not_have() -> None:
    book = PriceBook.start(PRICES)
    book.publish(PriceList({"other": Price(Decimal("1"), "USD")}), AT)
    assert BillingTransaction.from_usage(_at(AT - TICK), book.schedule, SOURCE).amount == 150
    with pytest.raises(UnknownMeter, match=r"^unknown meter 'api\.requests'$"):
        BillingTransaction.from_usage(_at(AT), book.schedule, SOURCE)


def test_from_usage_applies_the_per_unit_of_the_price() -> None:
    txn = _metered(meter="gpt-4o.input_tokens", quantity="2000")
    assert txn.per == 1_000_000
    assert txn.amount == Decimal("0.5")  # 2,000 x 2.50 / 1,000,000 = 0.5 cents, exact


def test_from_usage_accepts_a_record_currency_that_matches_in_any_case() -> None:
    assert _metered(currency="usd").currency == "USD"


def test_from_usage_rejects_a_record_currency_that_differs_from_the_meter() -> None:
    with pytest.raises(InvalidUsage, match=r"currency 'EUR' does not match meter 'api\.requests'"):
        _metered(currency="EUR")


def test_from_usage_rejects_an_unknown_meter() -> None:
    with pytest.raises(UnknownMeter, match="unknown meter 'nope'"):
        _metered(meter="nope")


# ---------------------------------------------------------------------------------------------
# the lifecycle


def _reserve(txn: BillingTransaction) -> None:
    txn.reserve(ACCOUNT)


def _fail(txn: BillingTransaction) -> None:
    txn.record_charge_failure(
        "APIConnectionError", "timed out", retryable=True, next_attempt_at=RETRY_AT
    )


def _charge(txn: BillingTransaction) -> None:
    txn.record_charged("ch_123")


def _compensate(txn: BillingTransaction) -> None:
    reversal = "re_1" if txn.state is TxnState.CHARGED else None
    txn.compensate("operator reversal", stripe_reversal_id=reversal)


STEPS: dict[str, Callable[[BillingTransaction], None]] = {
    "reserve": _reserve,
    "fail": _fail,
    "charge": _charge,
    "compensate": _compensate,
}
EVENT_OF = {
    "reserve": "Reserved",
    "fail": "ChargeFailed",
    "charge": "Charged",
    "compensate": "Compensated",
}

# What DESIGN.md allows: from each state, which steps.
ALLOWED: dict[TxnState, set[str]] = {
    TxnState.METERED: {"reserve", "compensate"},
    TxnState.RESERVED: {"fail", "charge", "compensate"},
    TxnState.CHARGE_FAILED: {"fail", "charge", "compensate"},
    TxnState.CHARGED: {"compensate"},
    TxnState.COMPENSATED: set(),
}

LEGAL_PATHS: list[tuple[tuple[str, ...], TxnState]] = [
    (("reserve",), TxnState.RESERVED),
    (("reserve", "charge"), TxnState.CHARGED),
    (("reserve", "fail"), TxnState.CHARGE_FAILED),
    (("reserve", "fail", "fail", "charge"), TxnState.CHARGED),
    (("reserve", "fail", "compensate"), TxnState.COMPENSATED),
    (("reserve", "compensate"), TxnState.COMPENSATED),
    (("compensate",), TxnState.COMPENSATED),
    (("reserve", "charge", "compensate"), TxnState.COMPENSATED),
]

# (steps that reach a state, a step that state does not allow)
ILLEGAL: list[tuple[tuple[str, ...], str]] = [
    ((), "fail"),  # a failed charge before any reservation
    ((), "charge"),  # a charge from Metered
    (("reserve",), "reserve"),  # reserve twice
    (("reserve", "fail"), "reserve"),
    (("reserve", "charge"), "reserve"),
    (("reserve", "charge"), "fail"),  # a failure after Charged
    (("reserve", "charge"), "charge"),  # charge twice
    (("compensate",), "reserve"),  # a refused transaction reserved later
    (("compensate",), "fail"),
    (("compensate",), "charge"),
    (("compensate",), "compensate"),  # compensate twice
    (("reserve", "compensate"), "charge"),  # a charge after Compensated
    (("reserve", "fail", "compensate"), "fail"),
    (("reserve", "fail", "compensate"), "charge"),
    (("reserve", "charge", "compensate"), "compensate"),  # reverse twice
    (("reserve", "charge", "compensate"), "charge"),
]


def _after(path: Sequence[str]) -> BillingTransaction:
    txn = _metered()
    for step in path:
        STEPS[step](txn)
    return txn


@pytest.mark.parametrize(
    ("path", "state"), LEGAL_PATHS, ids=["->".join(("metered", *p)) for p, _ in LEGAL_PATHS]
)
def test_every_legal_transition_reaches_its_state_and_records_one_event_per_step(
    path: tuple[str, ...], state: TxnState
) -> None:
    txn = _after(path)
    assert txn.state is state
    assert _event_names(txn) == ["Metered", *(EVENT_OF[step] for step in path)]
    assert txn.version == 1 + len(path)


def test_the_legal_paths_take_every_allowed_step_from_every_state() -> None:
    taken: set[tuple[TxnState, str]] = set()
    for path, _ in LEGAL_PATHS:
        txn = _metered()
        for step in path:
            taken.add((txn.state, step))
            STEPS[step](txn)
    assert taken == {(state, step) for state, steps in ALLOWED.items() for step in steps}


def test_the_illegal_table_covers_every_step_the_design_forbids() -> None:
    covered = {(_after(path).state, step) for path, step in ILLEGAL}
    forbidden = {
        (s, step) for s, allowed in ALLOWED.items() for step in STEPS if step not in allowed
    }
    assert covered >= forbidden
    assert not covered & {(s, step) for s, allowed in ALLOWED.items() for step in allowed}


@pytest.mark.parametrize(
    ("path", "step"), ILLEGAL, ids=[f"{'->'.join(('metered', *p))}-x-{s}" for p, s in ILLEGAL]
)
def test_every_illegal_transition_raises_and_records_nothing(
    path: tuple[str, ...], step: str
) -> None:
    txn = _after(path)
    state, version, events = txn.state, txn.version, len(txn.pending_events)
    with pytest.raises(IllegalTransition, match=f"transaction {txn.id} is {state}"):
        STEPS[step](txn)
    assert (txn.state, txn.version, len(txn.pending_events)) == (state, version, events)


def test_a_non_retryable_failure_is_illegal_from_metered_too() -> None:
    txn = _metered()
    with pytest.raises(IllegalTransition):
        txn.record_charge_failure("CardError", "declined", retryable=False, next_attempt_at=None)


# ---------------------------------------------------------------------------------------------
# guards and details of each step


def test_reserve_records_the_account() -> None:
    txn = _after(["reserve"])
    event = txn.pending_events[-1]
    assert isinstance(event, BillingTransaction.Reserved)
    assert txn.account_id == event.account_id == ACCOUNT


def test_a_retryable_failure_without_next_attempt_at_raises_value_error() -> None:
    txn = _after(["reserve"])
    with pytest.raises(ValueError, match="needs next_attempt_at"):
        txn.record_charge_failure("RateLimitError", "429", retryable=True, next_attempt_at=None)
    assert (txn.state, txn.attempts, len(txn.pending_events)) == (TxnState.RESERVED, 0, 2)


def test_a_non_retryable_failure_has_no_next_attempt() -> None:
    txn = _after(["reserve"])
    txn.record_charge_failure("CardError", "declined", retryable=False, next_attempt_at=RETRY_AT)
    assert txn.state is TxnState.CHARGE_FAILED
    assert txn.next_attempt_at is None
    event = txn.pending_events[-1]
    assert isinstance(event, BillingTransaction.ChargeFailed)
    assert (event.retryable, event.next_attempt_at) == (False, None)


def test_charge_attempts_count_up_and_keep_the_latest_error_and_due_time() -> None:
    txn = _after(["reserve"])
    for n in range(1, 4):
        due = AT + timedelta(seconds=2**n)
        txn.record_charge_failure("APIError", f"503 #{n}", retryable=True, next_attempt_at=due)
        assert (txn.attempts, txn.next_attempt_at) == (n, due)
    assert txn.last_error == "APIError: 503 #3"
    failures = [e for e in txn.pending_events if isinstance(e, BillingTransaction.ChargeFailed)]
    assert [e.attempt for e in failures] == [1, 2, 3]


def test_charged_records_the_stripe_object_and_clears_the_due_time() -> None:
    txn = _after(["reserve", "fail", "charge"])
    assert txn.stripe_object_id == "ch_123"
    assert txn.next_attempt_at is None
    assert txn.attempts == 1  # the failed attempt is still counted


@pytest.mark.parametrize("reason", ["", "   ", "\t\n"])
def test_a_compensation_needs_a_non_blank_reason(reason: str) -> None:
    txn = _after(["reserve"])
    with pytest.raises(ValueError, match="needs a reason"):
        txn.compensate(reason)
    assert (txn.state, len(txn.pending_events)) == (TxnState.RESERVED, 2)


def test_compensated_records_the_reason_the_state_it_left_and_the_stripe_reversal() -> None:
    txn = _after(["reserve", "fail"])
    txn.compensate("retry horizon passed", stripe_reversal_id="re_9")
    event = txn.pending_events[-1]
    assert isinstance(event, BillingTransaction.Compensated)
    assert txn.compensation_reason == event.reason == "retry horizon passed"
    assert txn.next_attempt_at is None
    assert (event.from_state, event.stripe_reversal_id) == ("charge_failed", "re_9")


@pytest.mark.parametrize(
    ("state", "terminal"),
    [
        (TxnState.METERED, False),
        (TxnState.RESERVED, False),
        (TxnState.CHARGE_FAILED, False),
        (TxnState.CHARGED, True),
        (TxnState.COMPENSATED, True),
    ],
)
def test_only_charged_and_compensated_are_terminal(state: TxnState, terminal: bool) -> None:
    assert state.is_terminal is terminal


# ---------------------------------------------------------------------------------------------
# reconstruction from events


@pytest.mark.parametrize(
    "path", [p for p, _ in LEGAL_PATHS], ids=["->".join(("metered", *p)) for p, _ in LEGAL_PATHS]
)
def test_the_transaction_rebuilt_from_its_events_equals_the_original(
    path: tuple[str, ...],
) -> None:
    txn = _after(path)
    events = txn.collect_events()
    rebuilt = functools.reduce(lambda agg, e: e.mutate(agg), events, None)
    assert isinstance(rebuilt, BillingTransaction)
    assert rebuilt == txn  # every attribute: state, amount, attempts, ids, timestamps
    assert (rebuilt.state, rebuilt.version, rebuilt.amount) == (txn.state, len(events), 150)


def test_reversing_a_charge_needs_the_id_of_its_stripe_reversal() -> None:
    txn = _metered()
    txn.reserve(account_id("acme", "USD"))
    txn.record_charged("ii_1")
    with pytest.raises(ValueError, match="Stripe reversal"):
        txn.compensate("operator reversal")
    assert txn.state is TxnState.CHARGED
    txn.compensate("operator reversal", stripe_reversal_id="re_1")
    assert txn.state is TxnState.COMPENSATED
