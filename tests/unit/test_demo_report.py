"""The demo's summary says what happened in a few sentences first, then the tables, with
money in the one format, each line's period, and the rounding said where it shows."""

from __future__ import annotations

import re
from typing import Any

from tools.demo_report import headline, render_summary

SUMMARY: dict[str, Any] = {
    "records_sent": 1500,
    "transactions": 1400,
    "duplicates_ignored": 60,
    "dead_letters": 40,
    "dead_letter_reasons": {"negative quantity": 25, "not valid JSON": 10, "unknown meter": 5},
    "refused_by_limit": 12,
    "conserved": True,
    "customers": {
        "acme": {
            "USD": {
                "transactions": 1400, "metered": "96.34675", "in_flight": "0",
                "charged": "96.34675", "compensated": "0",
            }
        }
    },
    "lines": [
        {
            "customer_id": "acme", "currency": "USD", "meter": "api.requests",
            "period_start": "2026-12-01 00:00", "transactions": 1400, "exact": "96.34675",
            "billed": 96, "stripe": 96, "requests": 3,
        }
    ],
    "invoices": [
        {
            "customer_id": "acme", "currency": "USD", "period_start": "2026-12-01 00:00",
            "state": "paid", "number": "INV-1", "lines": 1, "total": 96, "amount_paid": 96,
            "payment_attempts": 1,
        },
        {
            "customer_id": "beta", "currency": "USD", "period_start": "2026-12-01 00:00",
            "state": "finalized", "number": "INV-2", "lines": 1, "total": 5, "amount_paid": 0,
            "payment_attempts": 0,
        },
    ],
    "webhooks": {"invoice.paid": 1},
}  # fmt: skip


def test_the_summary_opens_with_what_happened() -> None:
    assert headline(SUMMARY) == [
        "1,500 usage records went in: 1,400 became transactions on 1 invoice lines, 60 were"
        " duplicates (ignored, never billed twice), 40 were set aside as dead letters (25"
        " negative quantity, 10 not valid JSON, 5 unknown meter).",
        "12 were refused by a customer's spend limit (not billed).",
        "2 invoices were closed and read back from Stripe; 1 are paid (0.96 USD).",
    ]
    assert render_summary(SUMMARY).splitlines()[:3] == headline(SUMMARY)


def test_the_lines_table_has_the_period_exact_money_and_the_rounding_note() -> None:
    text = render_summary(SUMMARY)
    [row] = [line for line in text.splitlines() if line.startswith("acme       2026-12-01")]
    assert row.split()[3:7] == ["api.requests", "1,400", "0.9634675", "USD"]
    assert "billed = the line's exact total rounded once, half up" in text
    unlabelled = [
        m.group()
        for m in re.finditer(r"(?<![\w:.+-])-?\d+\.\d+(?![\w:.-])", text)
        if not text[m.end() :].startswith((" USD", " EUR", "s"))
    ]
    assert unlabelled == []
