"""Anchored history: one hash chain over the whole log, and signed checkpoints of it.

Each event's own hash (``domain.chain``) chains it to its aggregate's previous event,
so it shows an edit that did not recompute the chain; it cannot show a rewrite by
someone who recomputes it, nor an aggregate's latest events, or a whole aggregate,
deleted. The **global chain** covers the whole log in commit order (the gap-free order
``(xid, notification_id)``): ``head_n = link_hash(head_{n-1}, id, version, topic,
state)`` from ``GENESIS``, over each event's *content* (not its stored hashes). A
**checkpoint** records how many events it covers, the position of the last one and
the head, signed with HMAC-SHA256 under a key the database never sees (the ``anchor``
job's); checkpoints are kept outside the database, one JSON line each, appended.

``AnchorCheck`` folds the log again and compares the head at every checkpoint's
position: any edit, deletion, insertion or re-chaining of an anchored event changes the
head (or the count) from that checkpoint on. The first checkpoint that differs, and
the last that still holds, bound where the history was changed.
"""

from __future__ import annotations

import hmac
import json
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from hashlib import sha256

from domain.chain import GENESIS, link_hash, topic_header

__all__ = [
    "AnchorCheck",
    "AnchorFinding",
    "BadCheckpoint",
    "Checkpoint",
    "GlobalChain",
    "LogEntry",
]

LogEntry = tuple[bytes, int, str, bytes, int, int]
"""One event as the anchor reads it, in commit order: the aggregate id's 16 bytes,
version, topic, state, xid, notification id."""

_VERSION = 1


class BadCheckpoint(ValueError):
    """Raised when a checkpoint line is malformed or its signature does not verify."""


@dataclass(frozen=True)
class Checkpoint:
    """The global chain's head after ``events`` events, the last at ``(xid,
    notification_id)``; ``at``: when it was made (ISO 8601, the anchor's clock)."""

    events: int
    xid: int
    notification_id: int
    head: str  # hex
    at: str

    @property
    def position(self) -> tuple[int, int]:
        return (self.xid, self.notification_id)

    def _payload(self) -> bytes:
        body = {"v": _VERSION, **asdict(self)}
        return json.dumps(body, sort_keys=True, separators=(",", ":")).encode()

    def signed_line(self, key: bytes) -> str:
        """The checkpoint as one JSON line with its signature (``mac``)."""
        mac = hmac.new(key, self._payload(), sha256).hexdigest()
        return json.dumps({"v": _VERSION, **asdict(self), "mac": mac}, sort_keys=True)

    @classmethod
    def verified(cls, line: str, key: bytes) -> Checkpoint:
        """The checkpoint of ``line`` (raises BadCheckpoint unless signed with ``key``)."""
        try:
            data = json.loads(line)
            mac = data.pop("mac")
            if data.pop("v") != _VERSION:
                raise BadCheckpoint("unknown checkpoint version")
            checkpoint = cls(
                events=int(data["events"]),
                xid=int(data["xid"]),
                notification_id=int(data["notification_id"]),
                head=str(data["head"]),
                at=str(data["at"]),
            )
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise BadCheckpoint(f"not a checkpoint: {exc}") from None
        expected = hmac.new(key, checkpoint._payload(), sha256).hexdigest()
        if not isinstance(mac, str) or not hmac.compare_digest(mac, expected):
            raise BadCheckpoint("signature does not verify (another key, or edited)")
        return checkpoint


@dataclass
class GlobalChain:
    """The global chain folded so far: how many events, the last position, the head."""

    events: int = 0
    xid: int = 0
    notification_id: int = 0
    head: bytes = GENESIS
    _headers: dict[str, bytes] = field(default_factory=dict, repr=False)

    @classmethod
    def after(cls, checkpoint: Checkpoint | None) -> GlobalChain:
        """The chain as ``checkpoint`` left it (from the start when None)."""
        if checkpoint is None:
            return cls()
        return cls(
            checkpoint.events,
            checkpoint.xid,
            checkpoint.notification_id,
            bytes.fromhex(checkpoint.head),
        )

    def add(self, entry: LogEntry) -> None:
        id_bytes, version, topic, state, xid, notification_id = entry
        header = self._headers.get(topic)
        if header is None:
            header = self._headers[topic] = topic_header(topic)
        self.head = link_hash(self.head, id_bytes, version, header, state)
        self.events += 1
        self.xid, self.notification_id = xid, notification_id

    def checkpoint(self, at: str) -> Checkpoint:
        return Checkpoint(self.events, self.xid, self.notification_id, self.head.hex(), at)


@dataclass(frozen=True)
class AnchorFinding:
    """Where the history and a checkpoint disagree."""

    subject: str
    detail: str


class AnchorCheck:
    """Fold the log (in commit order) against checkpoints (in the order they were made)."""

    def __init__(self, checkpoints: Sequence[Checkpoint]) -> None:
        self.checkpoints = sorted(checkpoints, key=lambda c: c.position)
        self.chain = GlobalChain()
        self.matched: Checkpoint | None = None  # the last checkpoint that holds
        self.finding: AnchorFinding | None = None
        self._next = 0

    def run(self, entries: Iterable[LogEntry]) -> AnchorCheck:
        for entry in entries:
            if self._next < len(self.checkpoints) and self.finding is None:
                self._passing((entry[4], entry[5]))
            self.chain.add(entry)
            while (
                self.finding is None
                and self._next < len(self.checkpoints)
                and self.checkpoints[self._next].position == (entry[4], entry[5])
            ):
                self._at(self.checkpoints[self._next])
        if self._next < len(self.checkpoints) and self.finding is None:
            self._fail(
                self.checkpoints[self._next],
                f"the history ends at {self.chain.events} event(s), before the event at"
                f" position {_pos(self.checkpoints[self._next])} that it anchored:"
                " anchored events were deleted",
            )
        return self

    @property
    def unanchored(self) -> int:
        """Events after the latest checkpoint (not covered by any signature yet)."""
        last = self.checkpoints[-1].events if self.checkpoints else 0
        return max(self.chain.events - last, 0)

    def _passing(self, position: tuple[int, int]) -> None:
        """Before folding the event at ``position``: a checkpoint whose last event
        should have come already is missing it."""
        cp = self.checkpoints[self._next]
        if cp.position < position:
            self._fail(
                cp,
                f"the event at position {_pos(cp)} that it anchored is gone (deleted), or"
                " its position was changed",
            )

    def _at(self, cp: Checkpoint) -> None:
        if self.chain.events != cp.events:
            self._fail(
                cp,
                f"{self.chain.events} event(s) up to position {_pos(cp)}, where it anchored"
                f" {cp.events}: events were deleted or inserted",
            )
        elif self.chain.head.hex() != cp.head:
            self._fail(
                cp,
                f"the {cp.events} event(s) up to position {_pos(cp)} are not those it"
                " anchored: an event was edited or replaced (with its hash chain recomputed"
                " or not)",
            )
        else:
            self.matched = cp
            self._next += 1

    def _fail(self, cp: Checkpoint, detail: str) -> None:
        held = (
            f"; the checkpoint of {self.matched.at} ({self.matched.events} events) still holds,"
            " so the change is after its position"
            if self.matched is not None
            else "; no earlier checkpoint holds"
        )
        self.finding = AnchorFinding(f"checkpoint of {cp.at}", detail + held)


def _pos(cp: Checkpoint) -> str:
    return f"(xid {cp.xid}, notification {cp.notification_id})"
