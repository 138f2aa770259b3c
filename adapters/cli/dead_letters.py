"""``billing-ledger dead-letters``: find the records the ledger set aside, see why, and
re-drive them once the cause is fixed.

A letter is named by where its record was read, as the logs name it: ``usage/3@67``
(topic, partition, offset). ``redrive`` sends a letter's original bytes back to the
usage topic, keyed by its customer as before, with a ``redriven_from`` header naming
the letter, then records that it did (``billing.dead_letters.redriven_at``): a second
redrive sends nothing new, and a crash between the two sends it again at worst, which
the ledger deduplicates by its usage id like any redelivery.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from adapters.cli.args import EXIT_USAGE, CliError, Parser, positive_int, timestamp, usage
from adapters.cli.output import print_table
from domain.usage import usage_id_of

__all__ = ["add_commands"]


def add_commands(sub: Any) -> None:
    letters = sub.add_parser(
        "dead-letters",
        help="records set aside, with their reasons: list, show, redrive",
        description="Find the records the ledger set aside, see why, and re-drive them once"
        " the cause is fixed (a price added, a producer mended).",
    )
    cmds = letters.add_subparsers(dest="letters_command", required=True, parser_class=Parser)
    listed = cmds.add_parser("list", help="the newest letters first")
    _filters(listed)
    listed.add_argument("--limit", type=positive_int, default=50, help="at most this many")
    listed.add_argument("--json", action="store_true", help="one JSON document, for programs")
    listed.set_defaults(handler=_list)
    shown = cmds.add_parser("show", help="one letter: reason, source, payload, usage id")
    shown.add_argument("letter", help="its id, as `list` and the logs name it: usage/3@67")
    shown.add_argument("--json", action="store_true", help="one JSON document, for programs")
    shown.set_defaults(handler=_show)
    redrive = cmds.add_parser(
        "redrive",
        help="send letters' original bytes to the usage topic again, once each",
    )
    redrive.add_argument("letter", nargs="?", help="one letter's id (or use the filters)")
    _filters(redrive)
    redrive.add_argument(
        "--limit", type=positive_int, default=10_000, help="at most this many (default 10,000)"
    )
    redrive.set_defaults(handler=_redrive)


def _filters(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--reason", help="only this reason code (the `code` column)")
    parser.add_argument("--since", type=timestamp, help="received at or after (ISO 8601)")
    parser.add_argument("--customer", help="only records keyed by this customer")


def _store() -> Any:
    from adapters.bootstrap import database
    from adapters.settings import Settings
    from store.dead_letters import DeadLetterStore

    return DeadLetterStore(database(Settings(), pool_size=0))


def _which(args: argparse.Namespace, *, redriven: bool | None = None) -> Any:
    from store.dead_letters import LetterFilter

    return LetterFilter(args.reason, args.since, args.customer, redriven)


def _row(letter: Any) -> dict[str, Any]:
    return {
        "letter": letter.id,
        "received_at": letter.received_at.isoformat(timespec="seconds"),
        "code": letter.code,
        "customer": letter.key.decode(errors="replace") if letter.key else None,
        "usage_id": usage_id_of(letter.payload),
        "reason": letter.reason,
        "redriven_at": letter.redriven_at.isoformat(timespec="seconds")
        if letter.redriven_at
        else None,
    }


def _list(args: argparse.Namespace) -> int:
    found = _store().find(_which(args), limit=args.limit)
    rows = [_row(letter) for letter in found]
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    for row in rows:
        if len(row["reason"]) > 60:
            row["reason"] = row["reason"][:57] + "..."
    print_table(rows, ["letter", "received_at", "code", "customer", "usage_id", "reason",
                       "redriven_at"])  # fmt: skip
    return 0


def _letter(text: str, store: Any) -> Any:
    from store.dead_letters import parse_letter_id

    where = parse_letter_id(text)
    if where is None:
        raise usage(f"{text!r} is not a letter id: give it as `list` shows it (usage/3@67)")
    letter = store.get(*where)
    if letter is None:
        raise CliError(f"no dead letter {text}: `billing-ledger dead-letters list`", EXIT_USAGE)
    return letter


def _show(args: argparse.Namespace) -> int:
    letter = _letter(args.letter, _store())
    body = {
        **_row(letter),
        "payload_bytes": letter.size,
        "payload_sha256": letter.sha256,
        "payload_whole": letter.whole,
        "payload": _shown(letter.payload),
    }
    if args.json:
        print(json.dumps(body, indent=2))
        return 0
    for key, value in body.items():
        print(f"{key:<15} {'' if value is None else value}")
    return 0


def _shown(payload: bytes | None) -> str | None:
    if payload is None:
        return None
    try:
        return payload.decode()
    except UnicodeDecodeError:
        return "hex:" + payload.hex()


def _redrive(args: argparse.Namespace) -> int:
    from adapters.broker import check_reachable, make_producer
    from adapters.settings import Settings

    filtered = args.reason or args.since or args.customer
    if (args.letter is None) == (not filtered):
        raise usage("give one letter's id, or filters (--reason, --since, --customer), not both")
    settings = Settings()
    store = _store()
    letters = [_letter(args.letter, store)] if args.letter else store.find(
        _which(args, redriven=False), limit=args.limit
    )  # fmt: skip
    check_reachable(settings.kafka_bootstrap)
    producer = make_producer(settings.kafka_bootstrap)
    sent, skipped = 0, []
    try:
        for n, letter in enumerate(letters, 1):
            why = _not_redriven(letter, settings.usage_topic)
            if why:
                skipped.append(f"{letter.id}: {why}")
                continue
            producer.send(
                settings.usage_topic, key=letter.key, value=letter.payload,
                headers=[("redriven_from", letter.id.encode())],
            ).get(timeout=30)  # fmt: skip
            sent += store.mark_redriven(letter)
            if n % 500 == 0:
                print(f"re-drove {sent} of {len(letters)}...", file=sys.stderr, flush=True)
    finally:
        producer.close()
    print(f"re-drove {sent} letter(s) to {settings.usage_topic}; they go through ingest again")
    for line in skipped:
        print(f"  not re-driven: {line}")
    return 0


def _not_redriven(letter: Any, usage_topic: str) -> str | None:
    """Why ``letter`` is not sent again (None: it is)."""
    if letter.redriven_at is not None:
        return f"re-driven already at {letter.redriven_at.isoformat(timespec='seconds')}"
    if letter.topic != usage_topic:
        return f"a {letter.topic} message, not a usage record: its own worker reads it again"
    if not letter.whole:
        return (
            f"only the first {len(letter.payload or b'')} of its {letter.size} bytes were kept:"
            " send it again from the producer"
        )
    return None
