"""What ``billing-ledger demo`` reports: its summary read back from the database
(``summarize``: transactions, duplicates, dead letters by reason, balances folded
from the history by ``tools.summary``), and that summary as a table for a person
(``render_summary``; ``--json`` prints it as it is).
"""

from __future__ import annotations

import re
from collections import Counter
from decimal import Decimal
from typing import Any

from adapters.bootstrap import database
from adapters.settings import Settings
from domain.money import format_money
from domain.ports import DeadLetter
from store.dead_letters import DeadLetterStore
from store.ledger import BillingLedger
from tools.summary import Balances
from tools.synthetic import Produced

__all__ = ["headline", "render_summary", "summarize"]


def summarize(
    ledger: BillingLedger, settings: Settings, produced: list[Produced]
) -> dict[str, Any]:
    """What happened, read back from the database (not from the worker's counters)."""
    balances = Balances().apply_all(ledger.all_events())
    letters = _dead_letters(settings)
    reasons = Counter(_reason_kind(d.reason) for d in letters)
    transactions = sum(b.transactions for c in balances.by_customer.values() for b in c.values())
    return {
        "records_sent": len(produced),
        "transactions": transactions,
        "duplicates_ignored": len(produced) - transactions - len(letters),
        "dead_letters": len(letters),
        "dead_letter_reasons": dict(sorted(reasons.items())),
        "refused_by_limit": sum(
            b.refused for c in balances.by_customer.values() for b in c.values()
        ),
        "conserved": all(b.conserved for c in balances.by_customer.values() for b in c.values()),
        "customers": balances.as_dict(),
    }


def _reason_kind(reason: str) -> str:
    """A reason without its particulars, for counting: digits and quoted values elided."""
    head = reason.split(": ", 1)[0] if reason.startswith("not valid JSON") else reason
    return re.sub(r"'[^']*'", "'…'", re.sub(r"\d+", "N", head))


def headline(summary: dict[str, Any]) -> list[str]:
    """What happened, in a few sentences, before the tables."""
    invoices = summary.get("invoices", [])
    paid = [i for i in invoices if i["state"] == "paid"]
    totals: Counter[str] = Counter()
    for inv in paid:
        totals[inv["currency"]] += inv["amount_paid"]
    reasons = summary["dead_letter_reasons"]
    top = ", ".join(f"{n} {r}" for r, n in sorted(reasons.items(), key=lambda x: -x[1])[:3])
    said = [
        f"{summary['records_sent']:,} usage records went in: {summary['transactions']:,} became"
        f" transactions on {len(summary.get('lines', [])):,} invoice lines,"
        f" {summary['duplicates_ignored']:,} were duplicates (ignored, never billed twice),"
        f" {summary['dead_letters']:,} were set aside as dead letters"
        + (f" ({top}{', ...' if len(reasons) > 3 else ''})" if reasons else "")
        + ".",
        f"{summary['refused_by_limit']:,} were refused by a customer's spend limit (not billed).",
    ]
    if "pricing" in summary:
        from tools.demo_pricing import pricing_headline

        said += pricing_headline(summary["pricing"])
    if invoices:
        money = ", ".join(format_money(n, cur) for cur, n in sorted(totals.items())) or "nothing"
        said.append(
            f"{len(invoices):,} invoices were closed and read back from Stripe;"
            f" {len(paid):,} are paid ({money})."
        )
    if "credits" in summary:  # the scene after the others' invoices are paid
        from tools.demo_credits import credits_headline

        said += credits_headline(summary["credits"])
    return said


def render_summary(summary: dict[str, Any]) -> str:
    """What happened in a few sentences, then the tables."""
    lines = [
        *headline(summary),
        "",
        f"records sent          {summary['records_sent']:>10,}",
        f"transactions          {summary['transactions']:>10,}",
        f"duplicates ignored    {summary['duplicates_ignored']:>10,}",
        f"dead letters          {summary['dead_letters']:>10,}",
        f"refused by limit      {summary['refused_by_limit']:>10,}",
        f"invoice lines         {len(summary.get('lines', [])):>10,}",
        f"Stripe invoice items  {summary.get('stripe', {}).get('live_invoice_items', 0):>10,}",
        f"Stripe requests       {summary.get('stripe', {}).get('requests', 0):>10,}",
        f"money conserved       {'yes' if summary['conserved'] else 'NO':>10}",
        "",
        f"{'customer':<10} {'cur':<4} {'txns':>7} {'metered':>18} {'in flight':>18} "
        f"{'charged':>18} {'compensated':>18}",
    ]
    for customer, currencies in summary["customers"].items():
        for cur, b in currencies.items():
            lines.append(
                f"{customer:<10} {cur:<4} {b['transactions']:>7,} "
                f"{_money(b['metered'], cur):>18} {_money(b['in_flight'], cur):>18} "
                f"{_money(b['charged'], cur):>18} {_money(b['compensated'], cur):>18}"
            )
    if summary.get("lines"):
        lines += [
            "",
            f"{'customer':<10} {'period (UTC)':<17} {'meter':<26} {'model':<14} {'records':>8}"
            f" {'exact':>20} {'billed':>14} {'in Stripe':>14} {'requests':>8}",
        ]
        for ln in summary["lines"]:
            cur = ln["currency"]
            lines.append(
                f"{ln['customer_id']:<10} {ln.get('period_start', ''):<17} {ln['meter']:<26}"
                f" {ln.get('model', ''):<14} {ln['transactions']:>8,}"
                f" {_money(ln['exact'], cur):>20}"
                f" {format_money(ln['billed'], cur):>14}"
                f" {format_money(ln['stripe'], cur):>14} {ln['requests']:>8}"
            )
        lines.append(
            "billed = the line's exact total rounded once, half up (records keep fractions"
            " of a cent); in Stripe = what Stripe's draft holds, read back; model: how the"
            " line is priced (graduated tN: by tiers of its quantity, tier N reached)"
        )
    if summary.get("invoices"):
        lines += [
            "",
            f"{'customer':<10} {'cur':<4} {'period (UTC)':<17} {'state':<11} {'number':<14}"
            f" {'lines':>5} {'total':>12} {'paid':>12} {'failed':>6}",
        ]
        for inv in summary["invoices"]:
            cur = inv["currency"]
            lines.append(
                f"{inv['customer_id']:<10} {cur:<4} {inv['period_start']:<17} {inv['state']:<11}"
                f" {inv['number'] or '-':<14} {inv['lines']:>5}"
                f" {format_money(inv['total'], cur):>12}"
                f" {format_money(inv['amount_paid'], cur):>12}"
                f" {inv['payment_attempts']:>6}"
            )
        received = summary.get("webhooks", {})
        lines.append(
            "webhooks recorded: " + ", ".join(f"{n} {t}" for t, n in sorted(received.items()))
        )
    if summary["dead_letter_reasons"]:
        lines += ["", "dead letters by reason:"]
        lines += [f"  {n:>6,}  {reason}" for reason, n in summary["dead_letter_reasons"].items()]
    if "audit" in summary:
        a = summary["audit"]
        verdict = "clean" if a["ok"] else f"{len(a['findings'])}+ finding(s)"
        lines += [
            "",
            f"audit: {verdict} ({a['events']:,} events replayed, {a['transactions']:,}"
            f" transactions, {a['stripe_items']:,} Stripe invoice items compared)",
        ]
        lines += [f"  - {finding}" for finding in a["findings"]]
    if "health" in summary:
        lines += ["", f"queue health: {summary['health']['status']}"]
        lines += [f"  - {reason}" for reason in summary["health"]["reasons"]]
    lines.append(f"\nfinished in {summary.get('seconds', 0):.1f}s")
    return "\n".join(lines)


def _dead_letters(settings: Settings) -> list[DeadLetter]:
    with database(settings, pool_size=0) as db:
        return DeadLetterStore(db).all(limit=1_000_000)


def _money(exact: str, currency: str) -> str:
    """An exact amount (decimal text, minor units), every digit kept."""
    return format_money(Decimal(exact), currency)
