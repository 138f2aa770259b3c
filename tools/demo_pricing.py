"""The demo's prices: a tiered meter, a price change during the usage, a contract with a
discount and a minimum commitment; and what they came to, read back for the summary.

Set up before any usage is produced, as an operator would with ``prices publish`` and
``contracts set``:

* version 2 of the price book, in force from the epoch: ``DEMO_TIERED_METER`` priced by
  graduated tiers (``tools.synthetic.demo_prices``);
* version 3, in force from ``PRICE_CHANGE_AFTER`` into the usage (the usage runs one
  record a second from yesterday 00:00): ``CHANGED_METER`` at ``CHANGE`` times its
  price, the tiers kept. Each record is priced by the version in force when it occurred,
  so the records on either side of the change are priced by their own version;
* a contract for ``CONTRACT_CUSTOMER`` (``CONTRACT``): 10% off ``DISCOUNTED_METER`` and
  a minimum of ``MINIMUM`` per hourly invoice, which its second hour (23 minutes of
  usage) falls short of: the close adds a true-up line for the shortfall, pushed and
  read back like a line.
"""

from __future__ import annotations

from collections import Counter
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

from adapters.bootstrap import database
from adapters.settings import Settings
from domain.closing import is_true_up
from domain.contract import ContractTerms
from domain.money import format_money
from domain.price_book import EPOCH
from domain.pricing import Price, PriceList
from store.ledger import BillingLedger
from tools.synthetic import DEMO_TIERED_METER, base_time, demo_prices

__all__ = [
    "CHANGED_METER",
    "CONTRACT_CUSTOMER",
    "PRICE_CHANGE_AFTER",
    "pricing_summary",
    "set_up_pricing",
]

CHANGED_METER = "api.requests"
CHANGE = Decimal("1.25")  # the new price: 25% up
PRICE_CHANGE_AFTER = timedelta(minutes=15)
CONTRACT_CUSTOMER = "hooli"
DISCOUNTED_METER = "gpt-4o.input_tokens"
MINIMUM = "300.00"  # USD an hour: between what hooli's first and second hours bill
CONTRACT = f"""
[meters."{DISCOUNTED_METER}"]
discount = "10"

[minimum]
USD = "{MINIMUM}"
"""


def set_up_pricing(ledger: BillingLedger, listed: PriceList) -> dict[str, Any]:
    """Publish the two versions and set the contract; what was set, for the summary."""
    tiered = demo_prices(listed)
    ledger.publish_prices(tiered, EPOCH)
    old = tiered.price_of(CHANGED_METER)
    new = Price(old.unit_price * CHANGE, old.currency, old.per, old.model, old.tiers)
    changed_at = base_time() + PRICE_CHANGE_AFTER
    version = ledger.publish_prices(PriceList({**tiered.prices, CHANGED_METER: new}), changed_at)
    terms = ContractTerms.from_toml(CONTRACT, tiered)
    contract = ledger.set_contract(CONTRACT_CUSTOMER, terms, base_time() - timedelta(days=1))
    return {
        "changed_meter": CHANGED_METER,
        "changed_at": changed_at.astimezone(UTC).strftime("%Y-%m-%d %H:%M"),
        "changed_version": version.number,
        "old_price": f"{old.unit_price:f}",
        "new_price": f"{new.unit_price:f}",
        "currency": old.currency,
        "contract_customer": CONTRACT_CUSTOMER,
        "contract_version": contract.number,
        "discounted_meter": DISCOUNTED_METER,
        "minimum": MINIMUM,
        "tiered_meter": DEMO_TIERED_METER,
    }


def pricing_summary(
    settings: Settings, set_up: dict[str, Any], lines: list[dict[str, Any]]
) -> dict[str, Any]:
    """How many of the changed meter's records each version priced (by when they
    occurred), the true-up lines the minimum added, the tiers the tiered lines reached."""
    changed_at = datetime.strptime(set_up["changed_at"], "%Y-%m-%d %H:%M").replace(tzinfo=UTC)
    with database(settings, pool_size=0) as db, db.connection() as conn:
        rows = conn.execute(
            "SELECT price_version, occurred_at >= %s FROM billing.transactions WHERE meter = %s",
            (changed_at, set_up["changed_meter"]),
        ).fetchall()
    by_version: Counter[str] = Counter()
    for version, after in rows:
        by_version[f"v{version} {'after' if after else 'before'}"] += 1
    true_ups = [
        {"customer_id": ln["customer_id"], "period_start": ln["period_start"],
         "meter": ln["meter"], "billed": ln["billed"], "currency": ln["currency"]}
        for ln in sorted(lines, key=lambda ln: (ln["customer_id"], ln["period_start"]))
        if is_true_up(ln["meter"])
    ]  # fmt: skip
    tiers = sorted({ln["model"] for ln in lines if ln["meter"] == set_up["tiered_meter"]})
    return {**set_up, "priced": dict(sorted(by_version.items())), "true_ups": true_ups,
            "tiered_lines": tiers}  # fmt: skip


def pricing_headline(pricing: dict[str, Any]) -> list[str]:
    """The prices' part of the demo's opening sentences."""
    priced = pricing["priced"]
    before = sum(n for k, n in priced.items() if k.endswith("before"))
    after = sum(n for k, n in priced.items() if k.endswith("after"))
    cur = pricing["currency"]
    said = [
        f"Prices changed at {pricing['changed_at']} UTC (version {pricing['changed_version']}):"
        f" {pricing['changed_meter']} went from {pricing['old_price']} to"
        f" {pricing['new_price']} {cur} a unit; {before:,} of its records occurred before and"
        f" kept the old price, {after:,} after and were priced by the new one"
        f" ({', '.join(f'{n:,} {k}' for k, n in priced.items())}).",
        f"{pricing['tiered_meter']} is priced by graduated tiers (the first hour of a period at"
        f" its list price, the rest 20% less): its lines reached"
        f" {', '.join(pricing['tiered_lines']) or 'no tier'}.",
    ]
    ups = pricing["true_ups"]
    owed = ", ".join(
        f"{format_money(t['billed'], t['currency'])} for {t['period_start']}" for t in ups
    )
    said.append(
        f"{pricing['contract_customer']} has a contract: 10% off {pricing['discounted_meter']}"
        f" and a minimum of {pricing['minimum']} USD an hour;"
        + (f" it fell short, so its invoice got a true-up line of {owed}." if ups
           else " it never fell short.")
    )  # fmt: skip
    return said
