"""``billing-ledger anchor``: signed checkpoints of the whole log, kept outside the database.

The job reads the log in commit order from where its last checkpoint ended (gap-free:
only rows older than every open transaction, so nothing can commit before them later),
continues the global chain (``domain.anchor``) and appends one signed line to
``ANCHOR_PATH``, a file the database's logins cannot reach (another host, a WORM
bucket's mount, an append-only file: ``chattr +a``). The HMAC key, ``ANCHOR_KEY``, is
in the job's settings only (and the auditor's, to verify): never in the database.

Continuing from the last checkpoint (not from the database) is the point: a history
rewritten between two runs is not signed again as if it were the truth; the next
audit, which folds the whole log from the first event, finds the first checkpoint
that no longer holds. The job reads only: it logs in as ``billing_auditor``.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

from adapters.audit.report import Anchors
from adapters.errors import AnchorError
from domain.anchor import BadCheckpoint, Checkpoint, GlobalChain
from store.connections import Database
from store.eventlog import copy_log

__all__ = [
    "AnchorError",
    "anchor_key",
    "anchor_once",
    "anchors",
    "latest_line",
    "load_checkpoints",
    "run_anchor",
]

log = logging.getLogger(__name__)

MIN_KEY_BYTES = 32


def anchor_key(secret: str) -> bytes:
    """The HMAC key from its setting (at least 32 bytes; else AnchorError)."""
    key = secret.encode()
    if len(key) < MIN_KEY_BYTES:
        raise AnchorError(
            f"BILLING_LEDGER_ANCHOR_KEY must be at least {MIN_KEY_BYTES} bytes"
            " (e.g. `openssl rand -hex 32`)"
        )
    return key


def load_checkpoints(path: Path, key: bytes) -> tuple[list[Checkpoint], list[str]]:
    """The checkpoints of ``path`` that verify, and a problem for each line that does not
    (a missing file: none of either)."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return [], []
    good: list[Checkpoint] = []
    bad: list[str] = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            good.append(Checkpoint.verified(line, key))
        except BadCheckpoint as exc:
            bad.append(f"{path}:{number}: {exc}")
    return good, bad


def latest_line(path: Path, key: bytes) -> str | None:
    """The signed line of the latest checkpoint that verifies (None: there is none)."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        return None
    best: tuple[tuple[int, int], str] | None = None
    for line in lines:
        try:
            checkpoint = Checkpoint.verified(line, key)
        except BadCheckpoint:
            continue
        if best is None or checkpoint.position > best[0]:
            best = (checkpoint.position, line)
    return best[1] if best else None


def anchors(path: Path, key: bytes) -> Anchors:
    """What an audit verifies the history against: the checkpoints of ``path``."""
    good, bad = load_checkpoints(path, key)
    return Anchors(str(path), good, bad)


def anchor_once(database: Database, path: Path, key: bytes) -> Checkpoint | None:
    """Sign the log up to now after the last checkpoint; None when nothing is new."""
    checkpoints, bad = load_checkpoints(path, key)
    if bad:
        raise AnchorError(f"the checkpoint file does not verify: {bad[0]}")
    last = max(checkpoints, key=lambda c: c.position) if checkpoints else None
    chain = GlobalChain.after(last)
    with database.dedicated() as conn:
        conn.read_only = True
        with conn.transaction():
            for entry in copy_log(conn, (chain.xid, chain.notification_id)):
                chain.add(entry)
    if last is not None and chain.events == last.events:
        return None
    checkpoint = chain.checkpoint(datetime.now(UTC).isoformat(timespec="seconds"))
    _append(path, checkpoint.signed_line(key))
    log.info(
        "history anchored",
        extra={"step": "anchor", "status": "signed", "events": checkpoint.events},
    )
    return checkpoint


def _append(path: Path, line: str) -> None:
    """One line at the end of ``path``, on disk before this returns (O_APPEND: never
    over an earlier line)."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, (line + "\n").encode())
        os.fsync(fd)
    finally:
        os.close(fd)


def run_anchor(
    database: Database,
    path: Path,
    key: bytes,
    *,
    every_s: float,
    stop: threading.Event,
    on_checkpoint: Callable[[Checkpoint | None], None] = lambda c: None,
) -> None:
    """``anchor_once`` every ``every_s`` seconds until ``stop`` is set."""
    while not stop.is_set():
        on_checkpoint(anchor_once(database, path, key))
        stop.wait(every_s)
