"""The ingest's dead letters: a reason's code, the letter of a record, and the message
on the dead-letter topic.

``quarantine`` stores a batch's letters in ``billing.dead_letters`` (idempotent by
source offset; a bounded prefix of the payload with its size and hash), then produces
each to the dead-letter topic with the reason in headers and flushes (a letter the broker
did not acknowledge is logged, and stays in the table: billing goes on). The topic gets
the whole payload up to ``dlq_max_message_bytes`` (its message limit), else the stored
prefix, with headers saying it was truncated and the whole one's size and SHA-256."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from kafka import KafkaProducer

from adapters.broker import PublishFailed, flush_acknowledged
from adapters.observability.logs import step_fields
from domain.ports import DeadLetter, DeadLetterSink
from domain.transaction import Source
from domain.usage import usage_id_of
from store.dead_letters import bounded

__all__ = ["REASON_CODES", "error_code", "internal_reason", "letter", "quarantine", "send_to_dlq"]

log = logging.getLogger(__name__)


def quarantine(
    letters: Sequence[DeadLetter],
    sink: DeadLetterSink,
    producer: KafkaProducer,
    topic: str,
    max_message_bytes: int,
) -> None:
    """Store a batch's dead letters, then put them on the dead-letter topic (see the
    module docstring)."""
    if not letters:
        return
    sink.record(letters)
    sent = []
    for d in letters:
        log.warning(
            "usage record quarantined",
            extra=step_fields("ingest", "dead_letter", error_code=d.code,
                              reason=d.reason, source=f"{d.topic}/{d.partition}@{d.offset}",
                              usage_id=usage_id_of(d.payload),
                              customer_id=d.key.decode(errors="replace") if d.key else None),
        )  # fmt: skip
        sent.append(send_to_dlq(producer, topic, d, max_message_bytes))
    try:
        flush_acknowledged(producer, sent)
    except PublishFailed as exc:  # the table has them: billing goes on, and says so
        log.warning(
            "dead letters not on the dead-letter topic: %s", exc,
            extra=step_fields("ingest", "dead_letter_topic_failed", topic=topic),
        )  # fmt: skip


def send_to_dlq(producer: KafkaProducer, topic: str, d: DeadLetter, max_message_bytes: int) -> Any:
    """The letter on the dead-letter topic: its bytes whole if the topic takes them,
    else the prefix the table keeps; headers say why, from where, and what the whole
    payload was (size, SHA-256, whether this is all of it). The send's future."""
    value = d.payload
    whole = bounded(value)
    truncated = value is not None and len(value) > max_message_bytes
    if truncated:
        value = whole.prefix
    headers = [
        ("dlq.reason", d.reason.encode()),
        ("dlq.source.topic", d.topic.encode()),
        ("dlq.source.partition", str(d.partition).encode()),
        ("dlq.source.offset", str(d.offset).encode()),
        ("dlq.truncated", b"true" if truncated else b"false"),
    ]
    if whole.size is not None and whole.sha256 is not None:
        headers += [
            ("dlq.payload.size", str(whole.size).encode()),
            ("dlq.payload.sha256", whole.sha256.encode()),
        ]
    return producer.send(
        topic,
        key=d.key,
        # Kafka needs a key or a value; a keyless null becomes an empty value.
        value=value if value is not None or d.key is not None else b"",
        headers=headers,
    )


# A reason's prefix and its code (the log's error_code, the letter's reason_code).
REASON_CODES = (
    ("empty message", "empty"),
    ("payload of", "oversized"),
    ("not valid JSON", "not_json"),
    ("number too long", "number_too_long"),
    ("number out of range", "number_out_of_range"),
    ("expected a JSON object", "not_object"),
    ("unknown currency", "unknown_currency"),
    ("currency ", "currency_mismatch"),
    ("unknown meter", "unknown_meter"),
    ("internal: ", "internal"),
    ("conflicting duplicate", "conflicting_duplicate"),
    ("occurred_at too old", "too_old"),
    ("occurred_at too far ahead", "too_far_ahead"),
)


def internal_reason(exc: Exception, source: Source) -> str:
    """The reason of a record that raised what no rule explains; logged with its traceback."""
    log.error(
        "usage record failed unexpectedly: %s: %s", type(exc).__name__, exc,
        exc_info=exc,
        extra=step_fields("ingest", "dead_letter", error_code="internal", source=str(source)),
    )  # fmt: skip
    return f"internal: {type(exc).__name__}"


def error_code(reason: str) -> str:
    """A dead letter's reason as a short code for logs (``invalid``: a field failed)."""
    return next((code for prefix, code in REASON_CODES if reason.startswith(prefix)), "invalid")


def letter(rec: Any, reason: str) -> DeadLetter:
    return DeadLetter(
        rec.topic, rec.partition, rec.offset, rec.key, rec.value, reason, code=error_code(reason)
    )
