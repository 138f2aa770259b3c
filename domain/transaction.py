"""The ``BillingTransaction`` aggregate: one priced usage record and its lifecycle.

::

                +--> Reserved --> Charged            (terminal: success)
     Metered ---+        |   \\--> ChargeFailed* --> Charged | Compensated
                |        \\-----------------------> Compensated (terminal)
                +--> Compensated  (refused: spend limit, ...)
     Charged --> Compensated  (operator reversal, with the Stripe reversal)
     Reserved | ChargeFailed | Charged --Repriced--> the same state, a new amount

``Metered`` keeps the exact amount (``Decimal`` minor units, never rounded) and names
the price book version that priced it: the one in force when the usage occurred
(``domain.price_book``; histories from before price books name the initial version), and
the customer's contract version when that overrode the meter's list price
(``domain.contract``; none in histories from before contracts, ``class_version`` < 4). A
transaction joins exactly one invoice line: its ``Reserved`` names the line (ingest
saves it with the line's ``Settled`` in one atomic save); ``Charged`` names the line
sequence Stripe acknowledged. Histories written before lines existed load through
upcasting (``class_version``): an integer amount, a ``Reserved`` without a line and a
``Charged`` of a per-transaction invoice item. Such a transaction that is not charged
yet joins a line later with ``Settled`` (ChargeFailed exists only in those histories).

``Repriced`` (``domain.repricing`` decides it): a price book version published later
for a moment at or before its usage prices it now. It names the old and the new version
and both exact amounts; the state stays what it was (a Charged transaction's line is
pushed again with its new total). Never after Compensated: released usage is not owed.

Public methods decide (check the state, compute); the private ``@event`` methods
only apply, because they are re-run on every load.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from enum import StrEnum
from typing import Any
from uuid import UUID

from eventsourcing.domain import Aggregate, event

from domain.errors import IllegalTransition, InvalidUsage
from domain.ids import transaction_id
from domain.price_book import (
    INITIAL_VERSION,
    PRICE_BOOK_ID,
    PriceSchedule,
    PriceVersion,
    as_schedule,
)
from domain.pricing import Price, PriceList
from domain.usage import UsageRecord

__all__ = [
    "ALLOWED_FROM",
    "BillingTransaction",
    "Priced",
    "Source",
    "TxnState",
    "price_of_record",
]


class TxnState(StrEnum):
    """Where a transaction is in its lifecycle."""

    METERED = "metered"
    RESERVED = "reserved"
    CHARGE_FAILED = "charge_failed"
    CHARGED = "charged"
    COMPENSATED = "compensated"

    @property
    def is_terminal(self) -> bool:
        """Charged and Compensated end the saga (a Charged one may still be reversed)."""
        return self in (TxnState.CHARGED, TxnState.COMPENSATED)


ALLOWED_FROM: dict[str, tuple[TxnState, ...]] = {
    "Reserved": (TxnState.METERED,),
    "Settled": (TxnState.RESERVED, TxnState.CHARGE_FAILED),
    "ChargeFailed": (TxnState.RESERVED, TxnState.CHARGE_FAILED),
    "Charged": (TxnState.RESERVED, TxnState.CHARGE_FAILED),
    "Repriced": (TxnState.RESERVED, TxnState.CHARGE_FAILED, TxnState.CHARGED),
    "Compensated": (
        TxnState.METERED,
        TxnState.RESERVED,
        TxnState.CHARGE_FAILED,
        TxnState.CHARGED,
    ),
}
"""The states each event after Metered may follow: the lifecycle above, as data
(the commands below and ``domain.audit``'s fold both check against it)."""


@dataclass(frozen=True)
class Source:
    """Where a usage record was read from, kept on the transaction for audit."""

    topic: str
    partition: int
    offset: int

    def __str__(self) -> str:
        return f"{self.topic}/{self.partition}@{self.offset}"


@dataclass(frozen=True)
class Priced:
    """Which price applies to a record: the price book version that prices it, the
    customer's contract version when it overrides the meter (else None), the price."""

    version: PriceVersion
    contract_version: int | None
    price: Price


def price_of_record(
    record: UsageRecord,
    prices: PriceList | PriceSchedule,
    period_start: datetime | None = None,
) -> Priced:
    """Which price applies to (customer, meter, moment): the one function that decides it.
    InvalidUsage (the dead letter's reason) when the book has no price for the meter, or
    the price is in another currency than the record names. The ingest's rule, and the
    producer's local check of it (which knows no contracts: the list decides the currency).

    The list price is the book version's in force when the record occurred, but for a
    meter priced by line quantity (``Price.by_line``): when the version in force at
    ``period_start`` (the start of the period the usage occurred in) or the one of its
    moment prices the meter by line quantity, the version at ``period_start`` prices it.
    Tiers in force at the start of a period apply to the whole period, and a change of
    model takes effect at the next period; per-unit prices change at their own moment.

    The customer's contract version in force at that same moment (``domain.contract``)
    overrides the list price when it names the meter (a replacement, or a discount off
    that list price)."""
    schedule = as_schedule(prices)
    moment = record.occurred_at
    version = schedule.price_at(moment)
    price = version.prices.price_of(record.meter)
    if period_start is not None and record.meter in schedule.by_line_meters:
        start = schedule.price_at(period_start)
        first = start.prices.prices.get(record.meter)
        if first is not None and (first.by_line or price.by_line):
            version, price, moment = start, first, period_start
    contract_version: int | None = None
    contract = schedule.contracts.get(record.customer_id) if schedule.contracts else None
    if contract is not None:
        terms = contract.at(moment)
        if terms is not None:
            special = terms.price_of(record.meter, price)
            if special is not None:
                price, contract_version = special, terms.number
    if record.currency is not None and record.currency.upper() != price.currency:
        raise InvalidUsage(
            f"currency {record.currency!r} does not match meter {record.meter!r} "
            f"priced in {price.currency}"
        )
    return Priced(version, contract_version, price)


class BillingTransaction(Aggregate):
    """One usage record, priced, held against a limit, charged or compensated."""

    class Metered(Aggregate.Created):
        class_version = 4
        customer_id: str
        usage_id: str
        meter: str
        quantity: Decimal
        unit_price: Decimal
        per: int
        amount: Decimal  # exact minor units (v1: an integer, rounded per record)
        currency: str
        occurred_at: datetime
        source: str
        price_book_id: UUID  # the price book version that priced it (v1, v2: none)
        price_version: int
        contract_version: int | None  # the customer's contract version, when it priced it

        @staticmethod
        def upcast_v1_v2(state: dict[str, Any]) -> None:
            state["amount"] = Decimal(state["amount"])

        @staticmethod
        def upcast_v2_v3(state: dict[str, Any]) -> None:
            # Priced by the configured file before price books: the book's initial
            # version (``domain.price_book``).
            state["price_book_id"] = PRICE_BOOK_ID
            state["price_version"] = INITIAL_VERSION

        @staticmethod
        def upcast_v3_v4(state: dict[str, Any]) -> None:
            state["contract_version"] = None  # recorded before contracts: list prices

    class Reserved(Aggregate.Event):
        class_version = 2
        account_id: UUID
        line_id: UUID | None  # None: reserved before lines existed
        line_version: int | None

        @staticmethod
        def upcast_v1_v2(state: dict[str, Any]) -> None:
            state["line_id"] = None
            state["line_version"] = None

    class Settled(Aggregate.Event):
        line_id: UUID
        line_version: int

    class ChargeFailed(Aggregate.Event):
        attempt: int
        error_class: str
        message: str
        retryable: bool
        next_attempt_at: datetime | None

    class Charged(Aggregate.Event):
        class_version = 2
        stripe_object_id: str  # the line's (first) invoice item; v1: the transaction's own
        line_id: UUID | None
        sequence: int | None  # the line sequence Stripe acknowledged

        @staticmethod
        def upcast_v1_v2(state: dict[str, Any]) -> None:
            state["line_id"] = None
            state["sequence"] = None

    class Repriced(Aggregate.Event):
        """Priced again by the version now in force when the usage occurred."""

        price_book_id: UUID
        price_version: int
        unit_price: Decimal
        per: int
        amount: Decimal  # the new exact amount (minor units)
        old_price_version: int
        old_amount: Decimal
        state: str  # the state it was in, and stays in

    class Compensated(Aggregate.Event):
        reason: str
        from_state: str
        stripe_reversal_id: str | None

    @staticmethod
    def create_id(customer_id: str, usage_id: str, **_: Any) -> UUID:
        return transaction_id(customer_id, usage_id)

    @classmethod
    def from_usage(
        cls, record: UsageRecord, prices: PriceList | PriceSchedule, source: Source
    ) -> BillingTransaction:
        """Price a valid usage record (raises InvalidUsage for an unknown meter/currency);
        a price by line quantity prices it as its line's first record."""
        fields, price = cls.priced(record, prices, source)
        if fields["amount"] is None:
            cls.priced_on_line(fields, price, Decimal(0))
        return cls(**fields)

    @staticmethod
    def metered_fields(
        record: UsageRecord,
        prices: PriceList | PriceSchedule,
        source: Source,
        period_start: datetime | None = None,
    ) -> dict[str, Any]:
        """The Metered event's fields for ``record`` (``priced``, without its price)."""
        return BillingTransaction.priced(record, prices, source, period_start)[0]

    @staticmethod
    def priced(
        record: UsageRecord,
        prices: PriceList | PriceSchedule,
        source: Source,
        period_start: datetime | None = None,
    ) -> tuple[dict[str, Any], Price]:
        """The Metered event's fields for ``record`` and the price that priced it: the one
        place usage is priced, by the price ``price_of_record`` chooses (a bare price
        list: the initial version). A price by line quantity leaves ``amount`` and
        ``unit_price`` None: they depend on the line the record joins, priced by this
        price (``priced_on_line``)."""
        priced = price_of_record(record, prices, period_start)
        version, price = priced.version, priced.price
        by_line = price.by_line
        return {
            "customer_id": record.customer_id,
            "usage_id": record.usage_id,
            "meter": record.meter,
            "quantity": record.quantity,
            "unit_price": None if by_line else price.unit_price,
            "per": price.per,
            "amount": None if by_line else price.exact_amount(record.quantity),
            "currency": price.currency,
            "occurred_at": record.occurred_at,
            "source": str(source),
            "price_book_id": version.book_id,
            "price_version": version.number,
            "contract_version": priced.contract_version,
        }, price

    @staticmethod
    def priced_on_line(
        fields: dict[str, Any], price: Price, before: Decimal, before_total: Decimal | None = None
    ) -> tuple[Decimal, Decimal]:
        """Complete ``fields`` of a record priced by line quantity, settled into a line
        holding ``before`` of its meter (``before_total``: ``f(before)``, computed when
        not given): its amount is what it adds to the line's total (``Price.step``), its
        unit price the rate of the tier the line reaches. The line's quantity and ``f``
        after it."""
        if before_total is None:
            before_total = price.total(before)
        after, after_total, fields["amount"] = price.step(before, before_total, fields["quantity"])
        fields["unit_price"] = price.rate_at(after)
        return after, after_total

    @event(Metered)
    def __init__(  # noqa: PLR0917 (the Metered event's fields, applied on every load)
        self,
        customer_id: str,
        usage_id: str,
        meter: str,
        quantity: Decimal,
        unit_price: Decimal,
        per: int,
        amount: Decimal,
        currency: str,
        occurred_at: datetime,
        source: str,
        price_book_id: UUID,
        price_version: int,
        contract_version: int | None = None,
    ) -> None:
        self.customer_id = customer_id
        self.usage_id = usage_id
        self.meter = meter
        self.quantity = quantity
        self.unit_price = unit_price
        self.per = per
        self.amount = amount
        self.currency = currency
        self.occurred_at = occurred_at
        self.source = source
        self.price_book_id = price_book_id
        self.price_version = price_version
        self.contract_version = contract_version
        self.state = TxnState.METERED
        self.account_id: UUID | None = None
        self.line_id: UUID | None = None
        self.line_version: int | None = None
        self.line_sequence: int | None = None  # the acknowledged sequence that charged it
        self.attempts = 0
        self.last_error: str | None = None
        self.next_attempt_at: datetime | None = None
        self.stripe_object_id: str | None = None
        self.compensation_reason: str | None = None

    # -- Reserved ---------------------------------------------------------------

    def reserve(
        self, account_id: UUID, line_id: UUID | None = None, line_version: int | None = None
    ) -> None:
        """Record that the amount is held against the customer's spend limit, and the
        invoice line (at its version) the transaction joined in the same save."""
        self._require("reserve", *ALLOWED_FROM["Reserved"])
        if (line_id is None) != (line_version is None):
            raise ValueError("a line and its version go together")
        self._reserved(account_id, line_id, line_version)

    @event(Reserved)
    def _reserved(self, account_id: UUID, line_id: UUID | None, line_version: int | None) -> None:
        self.account_id = account_id
        self.line_id = line_id
        self.line_version = line_version
        self.state = TxnState.RESERVED

    # -- Settled (histories from before lines) -------------------------------------

    def settle(self, line_id: UUID, line_version: int) -> None:
        """Join a line later: only a transaction reserved before lines existed."""
        self._require("join a line", *ALLOWED_FROM["Settled"])
        if self.line_id is not None:
            raise IllegalTransition(f"transaction {self.id} is in line {self.line_id} already")
        self._settled(line_id, line_version)

    @event(Settled)
    def _settled(self, line_id: UUID, line_version: int) -> None:
        self.line_id = line_id
        self.line_version = line_version
        self.next_attempt_at = None
        self.state = TxnState.RESERVED

    # -- ChargeFailed -----------------------------------------------------------

    def record_charge_failure(
        self, error_class: str, message: str, *, retryable: bool, next_attempt_at: datetime | None
    ) -> None:
        """Record one failed charge attempt and when (if ever) the next is due."""
        self._require("record a charge failure", *ALLOWED_FROM["ChargeFailed"])
        if retryable and next_attempt_at is None:
            raise ValueError("a retryable failure needs next_attempt_at")
        self._charge_failed(
            self.attempts + 1,
            error_class,
            message,
            retryable,
            next_attempt_at if retryable else None,
        )

    @event(ChargeFailed)
    def _charge_failed(
        self,
        attempt: int,
        error_class: str,
        message: str,
        retryable: bool,
        next_attempt_at: datetime | None,
    ) -> None:
        self.attempts = attempt
        self.last_error = f"{error_class}: {message}"
        self.next_attempt_at = next_attempt_at
        self.state = TxnState.CHARGE_FAILED

    # -- Charged ----------------------------------------------------------------

    def record_charged(
        self, stripe_object_id: str, line_id: UUID | None = None, sequence: int | None = None
    ) -> None:
        """Record that Stripe holds the charge: the push of the transaction's line at
        ``sequence`` (at or after the version the transaction joined) was acknowledged."""
        self._require("record a charge", *ALLOWED_FROM["Charged"])
        if line_id != self.line_id:
            raise IllegalTransition(f"transaction {self.id} is not in line {line_id}")
        if line_id is not None and (sequence is None or sequence < (self.line_version or 0)):
            raise IllegalTransition(
                f"line {line_id} at {sequence} does not include transaction {self.id}"
                f" (joined at {self.line_version})"
            )
        self._charged(stripe_object_id, line_id, sequence)

    @event(Charged)
    def _charged(self, stripe_object_id: str, line_id: UUID | None, sequence: int | None) -> None:
        self.stripe_object_id = stripe_object_id
        self.line_sequence = sequence
        self.next_attempt_at = None
        self.state = TxnState.CHARGED

    # -- Repriced ---------------------------------------------------------------

    def reprice(self, version: PriceVersion, price: Price, amount: Decimal) -> None:
        """Record that ``version`` (its ``price`` of this meter) prices the usage now, at
        the exact ``amount`` (``domain.repricing`` decides it; per-unit prices: quantity
        x price). Only a transaction in a line and not compensated; never in another
        currency, never by the version it names already."""
        self._require("reprice", *ALLOWED_FROM["Repriced"])
        if self.line_id is None:
            raise IllegalTransition(f"transaction {self.id} is in no line: nothing to reprice")
        if price.currency != self.currency:
            raise ValueError(
                f"transaction {self.id} is in {self.currency}, the price in {price.currency}"
            )
        if amount < 0:
            raise ValueError(f"an amount cannot be negative: {amount}")
        if (version.book_id, version.number) == (self.price_book_id, self.price_version):
            raise ValueError(f"transaction {self.id} is priced by version {version.number}")
        self._repriced(
            version.book_id,
            version.number,
            price.unit_price,
            price.per,
            amount,
            self.price_version,
            self.amount,
            str(self.state),
        )

    @event(Repriced)
    def _repriced(  # noqa: PLR0917 (the event's fields, applied on every load)
        self,
        price_book_id: UUID,
        price_version: int,
        unit_price: Decimal,
        per: int,
        amount: Decimal,
        old_price_version: int,
        old_amount: Decimal,
        state: str,
    ) -> None:
        self.price_book_id = price_book_id
        self.price_version = price_version
        self.unit_price = unit_price
        self.per = per
        self.amount = amount

    # -- Compensated ------------------------------------------------------------

    def compensate(self, reason: str, stripe_reversal_id: str | None = None) -> None:
        """Release the reservation (and record the Stripe reversal of a charge)."""
        self._require("compensate", *ALLOWED_FROM["Compensated"])
        if not reason.strip():
            raise ValueError("a compensation needs a reason")
        if self.state is TxnState.CHARGED and not stripe_reversal_id:
            raise ValueError("reversing a charge needs the id of its Stripe reversal")
        self._compensated(reason, str(self.state), stripe_reversal_id)

    @event(Compensated)
    def _compensated(self, reason: str, from_state: str, stripe_reversal_id: str | None) -> None:
        self.compensation_reason = reason
        self.next_attempt_at = None
        self.state = TxnState.COMPENSATED

    def _require(self, step: str, *allowed: TxnState) -> None:
        if self.state not in allowed:
            raise IllegalTransition(
                f"cannot {step}: transaction {self.id} is {self.state}"
                f" (allowed from {', '.join(allowed)})"
            )
