"""Balances folded from the event history: per customer and currency, where the money is.

``Balances.apply(event)`` is a pure fold over domain events in log order, used by
the demo's summary and by tests that check conservation (invariant I4); it is kept
apart from the audit's own fold (``domain.audit``) on purpose, so each checks the
other, and shares only the ``Balance`` it folds into::

    metered = charged + compensated + in flight
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from decimal import Decimal, localcontext
from typing import Any
from uuid import UUID

from domain.account import CustomerAccount
from domain.audit import Balance
from domain.transaction import BillingTransaction

__all__ = ["Balance", "Balances"]


@dataclass
class Balances:
    """The fold; ``by_customer[customer][currency]`` is a Balance."""

    by_customer: dict[str, dict[str, Balance]] = field(default_factory=dict)
    _txns: dict[UUID, tuple[str, str, Decimal, str]] = field(default_factory=dict, repr=False)
    _accounts: dict[UUID, tuple[str, str]] = field(default_factory=dict, repr=False)

    def apply_all(self, events: Iterable[Any]) -> Balances:
        with localcontext(prec=80):  # sums of exact amounts stay exact
            for event in events:
                self.apply(event)
        return self

    def apply(self, event: Any) -> None:
        if isinstance(event, BillingTransaction.Metered):
            bal = self._balance(event.customer_id, event.currency)
            bal.transactions += 1
            bal.metered += event.amount
            bal.in_flight += event.amount
            self._txns[event.originator_id] = (
                event.customer_id,
                event.currency,
                event.amount,
                "metered",
            )
        elif isinstance(event, BillingTransaction.Charged):
            customer, currency, amount, _ = self._txns[event.originator_id]
            bal = self._balance(customer, currency)
            bal.in_flight -= amount
            bal.charged += amount
            self._txns[event.originator_id] = (customer, currency, amount, "charged")
        elif isinstance(event, BillingTransaction.Compensated):
            customer, currency, amount, state = self._txns[event.originator_id]
            bal = self._balance(customer, currency)
            if state == "charged":
                bal.charged -= amount
            else:
                bal.in_flight -= amount
            bal.compensated += amount
            if event.from_state == "metered":
                bal.refused += 1
            self._txns[event.originator_id] = (customer, currency, amount, "compensated")
        elif isinstance(event, BillingTransaction.Repriced):
            customer, currency, amount, state = self._txns[event.originator_id]
            bal = self._balance(customer, currency)
            moved = event.amount - amount
            bal.metered += moved
            if state == "charged":
                bal.charged += moved
            else:
                bal.in_flight += moved
            self._txns[event.originator_id] = (customer, currency, event.amount, state)
        elif isinstance(event, CustomerAccount.Opened | CustomerAccount.LimitSet):
            if isinstance(event, CustomerAccount.Opened):
                self._accounts[event.originator_id] = (event.customer_id, event.currency)
            customer, currency = self._accounts[event.originator_id]
            self._balance(customer, currency).spend_limit = event.spend_limit

    def _balance(self, customer: str, currency: str) -> Balance:
        return self.by_customer.setdefault(customer, {}).setdefault(currency, Balance())

    def as_dict(self) -> dict[str, dict[str, dict[str, Any]]]:
        """Plain data for JSON: exact amounts as their decimal text."""
        return {
            customer: {
                cur: {k: f"{v:f}" if isinstance(v, Decimal) else v for k, v in asdict(bal).items()}
                for cur, bal in sorted(currencies.items())
            }
            for customer, currencies in sorted(self.by_customer.items())
        }
