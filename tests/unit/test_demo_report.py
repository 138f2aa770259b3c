"""The demo's summary says what happened in a few sentences first, then the tables, with
money in the one format, each line's period, and the rounding said where it shows."""

from __future__ import annotations

import re
from typing import Any

from tools.demo_credits import credits_headline
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


CREDITS: dict[str, Any] = {
    "customer_id": "pied-piper", "currency": "USD", "policy": "block", "record_amount": 500,
    "quantity": "4000", "records_sent": 15, "burn_records": 13, "accepted": 12,
    "refused": {"credits exhausted": 3}, "grant_id": "welcome",
    "grants": {
        "welcome": {"source": "promotional", "amount": 5000, "consumed": "5000",
                    "expired": "0", "voided": "0", "remaining": "0", "state": "live"},
        "top-up-1-1": {"source": "purchased", "amount": 5000, "consumed": "1000",
                       "expired": "0", "voided": "0", "remaining": "4000", "state": "live"},
    },
    "balance": "4000",
    "alerts": [
        {"threshold": "percent_of_grant:50", "value": "2500", "usage_id": "credit-05",
         "id": "a1"},
        {"threshold": "balance:1500", "value": "1500", "usage_id": "credit-07", "id": "a2"},
    ],
    "alerts_refused": 0,
    "top_up": {"below": 1000, "buy": 5000, "price": 4500, "started": 1,
               "grant_id": "top-up-1-1", "purchase": "paid", "stripe_invoice_id": "in_1"},
    "seconds": 6.5,
}  # fmt: skip


def test_the_credits_scene_is_told_last_in_plain_lines_with_money_in_the_one_format() -> None:
    said = credits_headline(CREDITS)
    assert said == [
        "Credits: pied-piper (policy block) got a promotional grant of 50.00 USD; 10 records"
        " of 5.00 USD burned it to 0.00 USD (granted 50.00 USD = consumed 50.00 USD + expired"
        " 0.00 USD + voided 0.00 USD + remaining 0.00 USD), and 3 more were refused (3 credits"
        " exhausted), not billed.",
        "Alerts received by the demo's webhook receiver on 127.0.0.1, signature verified:"
        " percent_of_grant:50 (at credit-05, value 25.00 USD); balance:1500 (at credit-07,"
        " value 15.00 USD).",
        "Top-up (below 10.00 USD, buy 50.00 USD for 45.00 USD): started once, its invoice in_1"
        " paid, grant top-up-1-1 live; 2 more records accepted after it (credit left 40.00"
        " USD); the scene took 6.5s.",
    ]
    assert headline({**SUMMARY, "credits": CREDITS})[-3:] == said
