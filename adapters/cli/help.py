"""Help that teaches: each command's ``--help`` ends with one or two examples and the
environment variables it reads, and every option says what it is for.

The examples and variables live here, in one table beside the command tree, so a test
can walk the tree and find a command without them (``tests/unit/test_cli_help.py``).
"""

from __future__ import annotations

import argparse

__all__ = ["COMMANDS", "OPTION_HELP", "teach"]

DB = "BILLING_LEDGER_DATABASE_URL"
KAFKA = "BILLING_LEDGER_KAFKA_BOOTSTRAP"
STRIPE = "BILLING_LEDGER_STRIPE_API_BASE, BILLING_LEDGER_STRIPE_API_KEY"

# command path -> (examples, the variables it reads)
COMMANDS: dict[str, tuple[tuple[str, ...], str]] = {
    "demo": (("billing-ledger demo", "billing-ledger demo --records 5000 --json"), "none"),
    "bench": (("billing-ledger bench ingest --records 100000",), "none: embedded services"),
    "bench ingest": (
        ("billing-ledger bench ingest --records 100000 --workers 2",),
        "none: embedded services (or --database-url)",
    ),
    "bench charge": (
        (
            "billing-ledger bench charge --rate 2000 --seconds 60 --stripe-rate 25",
            "billing-ledger bench charge --seconds 30 --plot charge.svg",
        ),
        "none: embedded services",
    ),
    "bench outage": (
        (
            "billing-ledger bench outage --rate 1000 --outage-s 20 --stripe-rate 25",
            "billing-ledger bench outage --plot outage.png",
        ),
        "none: embedded services",
    ),
    "bench fairness": (("billing-ledger bench fairness --burst 12000",), "none: embedded services"),
    "bench close": (
        ("billing-ledger bench close --customers 500 --stripe-rate 25 --verify both",),
        "none: embedded services",
    ),
    "bench replay": (("billing-ledger bench replay --events 1000000",), "none, or --database-url"),
    "bench relay": (("billing-ledger bench relay --events 200000",), "none, or --database-url"),
    "up": (
        ("billing-ledger up", "billing-ledger up --data-dir ./pgdata --kafka-port 9092"),
        "none: it prints the exports the other commands read",
    ),
    "migrate": (
        ("billing-ledger migrate", "billing-ledger migrate --status"),
        f"BILLING_LEDGER_MIGRATE_DATABASE_URL (else {DB}), the roles' passwords",
    ),
    "produce": (
        ("billing-ledger produce usage.jsonl", "some-exporter | billing-ledger produce -"),
        f"{KAFKA}, BILLING_LEDGER_USAGE_TOPIC, BILLING_LEDGER_PRICE_LIST (the local check)",
    ),
    "run": (
        ("billing-ledger run", "billing-ledger run --role ingest --role relay --health-port 8080"),
        f"every BILLING_LEDGER_* setting: {DB}, {KAFKA}, {STRIPE}, ...",
    ),
    "health": (("billing-ledger health", "billing-ledger health --watch --interval 5"), DB),
    "reverse": (
        ('billing-ledger reverse 6f1c2a3b-4d5e-5f60-8a7b-9c0d1e2f3a4b --reason "refund"',),
        f"{DB}, {STRIPE}",
    ),
    "history": (
        (
            "billing-ledger history 6f1c2a3b-4d5e-5f60-8a7b-9c0d1e2f3a4b",
            "billing-ledger history --customer acme --usage-id req-42",
        ),
        DB,
    ),
    "accounts": (("billing-ledger accounts show acme USD",), DB),
    "accounts set-limit": (
        (
            "billing-ledger accounts set-limit acme 250.00 USD",
            "billing-ledger accounts set-limit acme none USD",
        ),
        DB,
    ),
    "accounts show": (("billing-ledger accounts show acme USD --json",), DB),
    "balances": (
        ("billing-ledger balances --customer acme", "billing-ledger balances --as-of 2026-12-01"),
        DB,
    ),
    "transactions": (("billing-ledger transactions --state reserved --limit 20",), DB),
    "lines": (("billing-ledger lines --customer acme",), DB),
    "invoices": (("billing-ledger invoices --period 2026-11 --state finalized",), DB),
    "invoices close": (
        ('billing-ledger invoices close --period 2026-12 --customer acme --reason "moving plan"',),
        f"{DB}, {STRIPE}",
    ),
    "invoices preview": (
        (
            "billing-ledger invoices preview --customer acme",
            "billing-ledger invoices preview --customer acme --period 2026-12 --json",
        ),
        DB,
    ),
    "invoices settle": (
        (
            "billing-ledger invoices settle INVOICE_ID --how 'deleted the hand-made item ii_123"
            " in the dashboard' --by ops@example.com",
        ),
        DB,
    ),
    "invoices redraft": (
        (
            "billing-ledger invoices redraft INVOICE_ID --how 'draft deleted by mistake in the"
            " dashboard' --by ops@example.com",
        ),
        f"{DB}, {STRIPE}",
    ),
    "rebuild": (
        ("billing-ledger rebuild invoices", "billing-ledger rebuild --all"),
        f"BILLING_LEDGER_MIGRATE_DATABASE_URL (else {DB})",
    ),
    "prices": (("billing-ledger prices list",), DB),
    "prices publish": (
        (
            "billing-ledger prices publish prices.toml --effective-from 2027-01-01T00:00:00Z",
            "billing-ledger prices publish prices.toml",
        ),
        DB,
    ),
    "prices list": (("billing-ledger prices list --json",), DB),
    "prices reprice": (
        ("billing-ledger prices reprice --dry-run", "billing-ledger prices reprice"),
        DB,
    ),
    "prices show": (
        (
            "billing-ledger prices show",
            "billing-ledger prices show --at 2026-12-01T00:00:00Z",
            "billing-ledger prices show --customer acme",
        ),
        DB,
    ),
    "contracts": (("billing-ledger contracts show --customer acme",), DB),
    "contracts set": (
        (
            "billing-ledger contracts set --customer acme acme.toml"
            " --effective-from 2027-01-01T00:00:00Z",
            "billing-ledger contracts set --customer acme acme.toml",
        ),
        DB,
    ),
    "contracts show": (
        (
            "billing-ledger contracts show --customer acme",
            "billing-ledger contracts show --customer acme --at 2027-02-01T00:00:00+01:00 --json",
        ),
        DB,
    ),
    "credits": (("billing-ledger credits show acme USD",), DB),
    "credits grant": (
        (
            'billing-ledger credits grant acme 50.00 USD --source promotional --reason "welcome"'
            " --id welcome-2027 --expires-at 2027-03-31T23:59:59Z",
            'billing-ledger credits grant acme 10.00 USD --source manual --reason "outage"'
            " --priority -1",
            'billing-ledger credits grant acme 100.00 USD --source purchased --reason "pack"'
            " --id pack-1 --price 90.00",
        ),
        f"{DB}; {STRIPE} (a purchased grant's invoice)",
    ),
    "credits void": (
        ('billing-ledger credits void acme USD welcome-2027 --reason "granted in error"',),
        f"{DB}; {STRIPE} (a purchased grant's invoice, voided too while unpaid)",
    ),
    "credits reinstate": (
        ('billing-ledger credits reinstate acme USD pack-1 --reason "paid after the void"',),
        DB,
    ),
    "credits list": (("billing-ledger credits list --customer acme --json",), DB),
    "credits show": (("billing-ledger credits show acme USD --json",), DB),
    "credits policy": (
        (
            "billing-ledger credits policy --customer acme block",
            "billing-ledger credits policy --customer acme --currency EUR overage",
        ),
        DB,
    ),
    "credits top-up": (
        ("billing-ledger credits top-up set --customer acme --below 5 --buy 50",),
        DB,
    ),
    "credits top-up set": (
        (
            "billing-ledger credits top-up set --customer acme --below 5.00 --buy 50.00",
            "billing-ledger credits top-up set --customer acme --currency EUR --below 10"
            " --buy 100 --price 95",
        ),
        DB,
    ),
    "credits top-up clear": (("billing-ledger credits top-up clear --customer acme",), DB),
    "dead-letters": (("billing-ledger dead-letters list",), DB),
    "dead-letters list": (
        ("billing-ledger dead-letters list --reason unknown_meter --since 2026-12-04",),
        f"{DB} (the writer or the auditor: not billing_reader)",
    ),
    "dead-letters show": (("billing-ledger dead-letters show usage/3@67",), DB),
    "dead-letters redrive": (
        (
            "billing-ledger dead-letters redrive usage/3@67",
            "billing-ledger dead-letters redrive --reason unknown_meter",
        ),
        f"{DB}, {KAFKA}, BILLING_LEDGER_USAGE_TOPIC",
    ),
    "audit": (
        (
            "billing-ledger audit",
            "billing-ledger audit --customer acme --stripe --json",
            "billing-ledger audit --stripe --metrics-file /var/lib/node_exporter/audit.prom",
        ),
        f"{DB} (as billing_auditor), BILLING_LEDGER_ANCHOR_PATH, BILLING_LEDGER_ANCHOR_KEY,"
        f" {STRIPE} (with --stripe)",
    ),
    "export": (
        ("billing-ledger export --customer acme --from 2026-11-01 > acme.jsonl",),
        f"{DB} (as billing_auditor)",
    ),
    "alerts": (("billing-ledger alerts list --customer acme --currency USD",), DB),
    "alerts set": (
        (
            "billing-ledger alerts set --customer acme --currency USD --percent-of-limit 50,80,100",
            "billing-ledger alerts set --customer acme --currency USD --spend 10000",
            "billing-ledger alerts set --customer acme --currency USD --balance 500,0"
            " --percent-of-grant 90",
        ),
        DB,
    ),
    "alerts list": (("billing-ledger alerts list --customer acme --currency USD --json",), DB),
    "webhooks": (("billing-ledger webhooks list",), DB),
    "webhooks add": (
        ("billing-ledger webhooks add https://hooks.example.com/billing --events alert.crossed",),
        f"{DB}, BILLING_LEDGER_ALERT_WEBHOOK_ALLOW_PRIVATE",
    ),
    "webhooks list": (("billing-ledger webhooks list --all",), DB),
    "webhooks remove": (
        ("billing-ledger webhooks remove 0b7e1f52-93a4-4c61-8d2e-4a6f3b9c1e07",),
        DB,
    ),
    "webhooks deliveries": (
        (
            "billing-ledger webhooks deliveries",
            "billing-ledger webhooks deliveries --endpoint 0b7e1f52-93a4-4c61-8d2e-4a6f3b9c1e07",
        ),
        DB,
    ),
    "webhooks replay": (
        ("billing-ledger webhooks replay 5f0c7d36-4d8e-5b8a-9a57-2f0b5e3c9d41",),
        DB,
    ),
    "anchor": (
        ("billing-ledger anchor", "billing-ledger anchor --every 300"),
        f"{DB}, BILLING_LEDGER_ANCHOR_PATH, BILLING_LEDGER_ANCHOR_KEY",
    ),
    "completion": (
        (
            "billing-ledger completion bash"
            " > ~/.local/share/bash-completion/completions/billing-ledger",
        ),
        "none",
    ),
}

# Options that say nothing in their own definition, by their destination.
OPTION_HELP: dict[str, str] = {
    "json": "one JSON document, for programs (amounts in minor units)",
    "records": "how many usage records",
    "seed": "the random seed of the synthetic usage (the same seed, the same records)",
    "batch": "records per save",
    "seconds": "how long the load runs",
    "customers": "how many customers the load spreads over",
    "concurrency": "Stripe requests in flight at most",
    "outage_at": "seconds into the load when Stripe starts failing",
    "outage_s": "how long Stripe fails",
    "before_s": "seconds measured before the burst",
    "after_s": "seconds measured after the burst",
    "events": "how many events to write (then replay, or relay)",
    "log_level": "DEBUG, INFO, WARNING or ERROR (JSON lines on stderr)",
    "txn_id": "the transaction's id (a UUID: `transactions` lists them)",
    "reason": "why, in words: recorded in the ledger",
    "customer": "the customer's id",
    "usage_id": "the usage record's id, as its producer sent it",
    "currency": "an ISO 4217 code: USD, EUR, JPY, ...",
}


def teach(parser: argparse.ArgumentParser, path: str = "") -> None:
    """Give every command under ``parser`` its examples and variables, and every option
    without help its description (``COMMANDS``, ``OPTION_HELP``)."""
    for action in parser._actions:
        if not action.help and action.dest in OPTION_HELP:
            action.help = OPTION_HELP[action.dest]
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                here = f"{path} {name}".strip()
                _epilog(sub, here)
                teach(sub, here)


def _epilog(parser: argparse.ArgumentParser, path: str) -> None:
    if path not in COMMANDS or (parser.epilog and "examples:" in parser.epilog):
        return
    examples, reads = COMMANDS[path]
    lines = ["examples:", *(f"  {e}" for e in examples), "", f"reads: {reads}"]
    parser.epilog = "\n".join(lines)
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
