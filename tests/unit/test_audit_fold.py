"""``domain.audit``: the replay fold agrees with the ``BillingTransaction`` aggregate on
every sequence of commands, and balances and invariants are found from its results."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any
from uuid import UUID

import pytest

from domain.audit import Balance, TxnAudit, balances_of, check_balances, check_transactions
from domain.errors import IllegalTransition
from domain.pricing import Price, PriceList
from domain.transaction import BillingTransaction, Source
from domain.usage import UsageRecord

PRICES = PriceList({"api.requests": Price(Decimal("0.01"), "USD")})
DUE = datetime(2026, 12, 2, 11, tzinfo=UTC)
ACCOUNT = UUID(int=7)

Command = Callable[[BillingTransaction], None]
COMMANDS: dict[str, Command] = {
    "reserve": lambda t: t.reserve(ACCOUNT),
    "fail_retry": lambda t: t.record_charge_failure(
        "Timeout", "t", retryable=True, next_attempt_at=DUE
    ),
    "fail_perm": lambda t: t.record_charge_failure(
        "Card", "no", retryable=False, next_attempt_at=None
    ),
    "charge": lambda t: t.record_charged("ii_1"),
    "compensate": lambda t: t.compensate("gave up"),
    "reverse": lambda t: t.compensate("refund", "ii_1"),
}


def _plain(event: Any) -> dict[str, Any]:
    """An event's fields as the audit reads them from the store (dates as ISO strings)."""
    return {key: _text(value) for key, value in vars(event).items()}


def _text(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    return str(value) if isinstance(value, Decimal | UUID) else value


def _new_txn(usage_id: str = "u-1", quantity: int = 500) -> BillingTransaction:
    record = UsageRecord(
        usage_id=usage_id,
        customer_id="acme",
        meter="api.requests",
        quantity=Decimal(quantity),
        occurred_at=datetime(2026, 12, 1, tzinfo=UTC),
    )
    return BillingTransaction.from_usage(record, PRICES, Source("usage", 0, 1))


def _would_record(txn: BillingTransaction, name: str) -> tuple[str, dict[str, Any]]:
    """The event an illegal command would have recorded, as data (for the fold)."""
    state = str(txn.state)
    return {
        "reserve": ("Reserved", {"account_id": str(ACCOUNT)}),
        "fail_retry": ("ChargeFailed", {"attempt": txn.attempts + 1, "error_class": "Timeout",
                                        "message": "t", "retryable": True,
                                        "next_attempt_at": DUE.isoformat()}),
        "fail_perm": ("ChargeFailed", {"attempt": txn.attempts + 1, "error_class": "Card",
                                       "message": "no", "retryable": False,
                                       "next_attempt_at": None}),
        "charge": ("Charged", {"stripe_object_id": "ii_1"}),
        "compensate": ("Compensated", {"reason": "gave up", "from_state": state,
                                       "stripe_reversal_id": None}),
        "reverse": ("Compensated", {"reason": "refund", "from_state": state,
                                    "stripe_reversal_id": "ii_1"}),
    }[name]  # fmt: skip


def _fields(obj: Any) -> tuple[Any, ...]:
    next_at = obj.next_attempt_at
    return (
        str(obj.state),
        obj.attempts,
        obj.last_error,
        next_at.isoformat() if isinstance(next_at, datetime) else next_at,
        obj.stripe_object_id,
        obj.compensation_reason,
        obj.amount,
        obj.customer_id,
    )


@pytest.mark.parametrize("length", [1, 2, 3, 4, 5])
def test_the_fold_accepts_exactly_what_the_aggregate_accepts_and_ends_in_its_state(
    length: int,
) -> None:
    checked_illegal = 0
    for names in itertools.product(COMMANDS, repeat=length):
        txn = _new_txn()
        created, *_ = txn.collect_events()
        fold = TxnAudit.metered(str(txn.id), _plain(created))
        for name in names:
            try:
                COMMANDS[name](txn)
            except (IllegalTransition, ValueError):
                event_name, data = _would_record(txn, name)
                fold.apply(event_name, data, txn.version + 1)
                assert fold.problems, (names, name)  # the fold flags what the aggregate refused
                checked_illegal += 1
                break
            (event,) = txn.collect_events()
            fold.apply(type(event).__name__, _plain(event), event.originator_version)
            assert fold.problems == (), (names, fold.problems)
            assert _fields(fold) == _fields(txn), names
    assert checked_illegal > 0


def test_a_second_charge_is_named_a_double_charge() -> None:
    fold = TxnAudit.metered(str(UUID(int=1)), _plain(_new_txn().collect_events()[0]))
    fold.apply("Reserved", {"account_id": str(ACCOUNT)}, 2)
    fold.apply("Charged", {"stripe_object_id": "ii_1"}, 3)
    fold.apply("Charged", {"stripe_object_id": "ii_2"}, 4)
    findings = check_transactions([fold], now=DUE, horizon=timedelta(days=3650))
    assert [f.kind for f in findings] == ["sequence", "double_charge"]
    assert "v4" in findings[1].detail


def test_a_compensation_must_name_its_reason_and_its_true_from_state() -> None:
    fold = TxnAudit.metered("t", _plain(_new_txn().collect_events()[0]))
    fold.apply("Compensated", {"reason": " ", "from_state": "metered"}, 2)
    other = TxnAudit.metered("t", _plain(_new_txn().collect_events()[0]))
    other.apply("Compensated", {"reason": "x", "from_state": "reserved"}, 2)
    assert fold.problems == ("v2: Compensated without a reason",)
    assert other.problems == ("v2: Compensated says from reserved, the history says metered",)


def test_an_unknown_event_is_a_sequence_problem() -> None:
    fold = TxnAudit.metered("t", _plain(_new_txn().collect_events()[0]))
    fold.apply("Metered", {}, 2)
    assert fold.problems == ("v2: Metered is not a transaction event after Metered",)


def test_non_terminal_past_the_horizon_without_a_reason_is_overdue() -> None:
    txn = _new_txn()
    metered_at = txn.collect_events()[0].timestamp
    stuck = TxnAudit.metered("stuck", _plain(_new_txn("u-1").collect_events()[0]))
    stuck.metered_at = metered_at.isoformat()
    failing = TxnAudit.metered("failing", _plain(_new_txn("u-2").collect_events()[0]))
    failing.metered_at = metered_at.isoformat()
    failing.apply("Reserved", {}, 2)
    failing.apply("ChargeFailed", _would_record(txn, "fail_retry")[1] | {"attempt": 1}, 3)
    hour = timedelta(hours=1)
    assert check_transactions([stuck, failing], now=metered_at + hour / 2, horizon=hour) == []
    late = check_transactions([stuck, failing], now=metered_at + 2 * hour, horizon=hour)
    assert [(f.kind, f.subject) for f in late] == [("overdue", "stuck")]


def test_balances_put_each_amount_where_its_state_says_and_are_conserved() -> None:
    txns = []
    for i, path in enumerate(
        [["reserve", "charge"], ["reserve"], ["compensate"], ["reserve", "charge", "reverse"]]
    ):
        txn = _new_txn(f"u-{i}", quantity=100 * (i + 1))
        fold = TxnAudit.metered(str(txn.id), _plain(txn.collect_events()[0]))
        for name in path:
            COMMANDS[name](txn)
            (event,) = txn.collect_events()
            fold.apply(type(event).__name__, _plain(event), event.originator_version)
        txns.append(fold)
    got = balances_of(txns, {("acme", "USD"): 2000, ("bolt", "EUR"): None})
    assert got == {
        ("acme", "USD"): Balance(
            metered=1000,
            charged=100,
            compensated=700,
            in_flight=200,
            transactions=4,
            refused=1,
            spend_limit=2000,
        ),
        ("bolt", "EUR"): Balance(),
    }
    assert got["acme", "USD"].available == 2000 - (1000 - 700)
    assert check_balances(got) == []
    broken = {("acme", "USD"): Balance(metered=5, charged=1)}
    assert [f.subject for f in check_balances(broken)] == ["acme/USD"]
