"""Synthetic usage for the demo and the benchmarks: deterministic for a given seed.

A stream of usage records for a handful of customers across the price list's
meters, with exact duplicates (the same record sent again, as a producer retry
would) and malformed records of every kind the ingest must quarantine.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal

from domain.pricing import Price, PriceList, Tier
from domain.usage import UsageRecord

__all__ = [
    "DEMO_CUSTOMERS",
    "DEMO_LIMITS",
    "DEMO_TIERED_METER",
    "MALFORMED",
    "Produced",
    "base_time",
    "bench_usage",
    "demo_prices",
    "synthetic_usage",
]

DEMO_CUSTOMERS = ("acme", "globex", "initech", "umbrella", "hooli")
# One customer runs into its spend limit, so the demo shows refusals too (minor units).
DEMO_LIMITS: dict[tuple[str, str], int] = {("initech", "USD"): 500}


def base_time() -> datetime:
    """When synthetic usage starts: yesterday at midnight UTC. Recent enough for the
    ledger's window on ``occurred_at`` (``domain.usage.UsageWindow``) whenever it runs,
    and a whole day in the past, so the demo's hourly periods have all ended."""
    today = datetime.now(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    return today - timedelta(days=1)


# The demo prices this meter by graduated tiers (``demo_prices``): the first hour of GPU
# time in a period at its listed price, the rest at 80% of it.
DEMO_TIERED_METER = "gpu.a100.seconds"

MALFORMED = (
    "bad_json",
    "negative_quantity",
    "unknown_meter",
    "missing_field",
    "oversized",
    "unknown_currency",
)


@dataclass(frozen=True)
class Produced:
    """One message as produced: its key, its bytes, and what it is."""

    key: bytes
    value: bytes
    kind: str  # "valid", "duplicate" or a MALFORMED name
    record: UsageRecord | None = None


def synthetic_usage(
    n: int,
    prices: PriceList,
    *,
    seed: int = 7,
    duplicate_rate: float = 0.05,
    malformed_rate: float = 0.03,
    max_record_bytes: int = 16 * 1024,
) -> Iterator[Produced]:
    """``n`` messages: valid records, duplicates of earlier ones, malformed ones."""
    rng = random.Random(seed)
    start = base_time()
    meters = sorted(prices.prices)
    sent: list[Produced] = []
    malformed = 0
    for i in range(n):
        roll = rng.random()
        if roll < malformed_rate:
            yield _malformed(MALFORMED[malformed % len(MALFORMED)], i, seed, max_record_bytes)
            malformed += 1
        elif roll < malformed_rate + duplicate_rate and sent:
            original = rng.choice(sent)
            yield Produced(original.key, original.value, "duplicate", original.record)
        else:
            meter = rng.choice(meters)
            record = UsageRecord(
                usage_id=f"u-{seed}-{i:08d}",
                customer_id=rng.choice(DEMO_CUSTOMERS),
                meter=meter,
                quantity=_quantity(rng, meter),
                occurred_at=start + timedelta(seconds=i),
            )
            produced = Produced(record.customer_id.encode(), record.to_json(), "valid", record)
            sent.append(produced)
            yield produced


def _quantity(rng: random.Random, meter: str) -> Decimal:
    if meter.endswith("tokens"):
        return Decimal(rng.randint(50, 400_000))
    if meter.endswith("seconds"):
        return Decimal(rng.randint(1, 36_000)) / 10
    return Decimal(rng.randint(1, 200))


def _malformed(kind: str, i: int, seed: int, max_bytes: int) -> Produced:
    good = {
        "usage_id": f"bad-{seed}-{i}",
        "customer_id": "acme",
        "meter": "api.requests",
        "quantity": 1,
        "occurred_at": base_time().isoformat(),
    }
    match kind:
        case "bad_json":
            value = b'{"usage_id": "broken", '
        case "negative_quantity":
            value = json.dumps({**good, "quantity": -5}).encode()
        case "unknown_meter":
            value = json.dumps({**good, "meter": "quantum.qubits"}).encode()
        case "missing_field":
            value = json.dumps({k: v for k, v in good.items() if k != "customer_id"}).encode()
        case "oversized":
            value = json.dumps({**good, "note": "x" * max_bytes}).encode()
        case _:
            value = json.dumps({**good, "currency": "XYZ"}).encode()
    return Produced(b"acme", value, kind)


def bench_usage(n: int, *, customers: int = 50) -> list[UsageRecord]:
    """``n`` valid records spread over ``customers`` customers and three meters (the
    benchmarks' load: no duplicates, nothing malformed)."""
    meters = ("gpt-4o.input_tokens", "gpt-4o.output_tokens", "api.requests")
    start = base_time()
    return [
        UsageRecord(
            usage_id=f"bench-{i}",
            customer_id=f"cust-{i % customers:03d}",
            meter=meters[i % len(meters)],
            quantity=Decimal(1000 + i % 5000),
            occurred_at=start + timedelta(milliseconds=i),
        )
        for i in range(n)
    ]


def demo_prices(prices: PriceList) -> PriceList:
    """``prices`` with ``DEMO_TIERED_METER`` priced by graduated tiers: its listed price
    for the first 3,600 seconds of a line's period, 80% of it above."""
    price = prices.price_of(DEMO_TIERED_METER)
    tiers = (
        Tier(3600, price.unit_price),
        Tier(None, price.unit_price * Decimal("0.8")),
    )
    tiered = Price(price.unit_price, price.currency, price.per, "graduated", tiers)
    return PriceList({**prices.prices, DEMO_TIERED_METER: tiered})
