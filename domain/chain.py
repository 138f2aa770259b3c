"""Tamper evidence: each stored event's hash covers its content and its predecessor's hash.

``event_hash(prev, ...)`` is SHA-256 over the previous event's hash (of the same
aggregate; ``GENESIS``, 32 zero bytes, for version 1), the aggregate id (16 bytes),
the version (8 bytes, big-endian), the topic (its UTF-8 length in 4 bytes, then the
bytes) and the stored state. Editing, deleting or reordering a stored event breaks
the chain from that event on; ``check_chain`` names where. A snapshot is sealed to its
head event the same way (``snapshot_seal``).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from hashlib import sha256
from uuid import UUID

__all__ = [
    "GENESIS",
    "ChainBreak",
    "ChainLink",
    "check_chain",
    "event_hash",
    "link_hash",
    "link_problem",
    "snapshot_seal",
    "topic_header",
]

GENESIS = bytes(32)


def event_hash(prev: bytes, originator_id: UUID, version: int, topic: str, state: bytes) -> bytes:
    """The hash a stored event carries (see the module docstring)."""
    return link_hash(prev, originator_id.bytes, version, topic_header(topic), state)


def snapshot_seal(
    head_hash: bytes, originator_id: UUID, version: int, topic: str, state: bytes
) -> bytes:
    """A snapshot's seal: ``event_hash`` with the hash of the event the snapshot was
    taken at (its head: same aggregate, same version) in place of a predecessor's. A
    snapshot whose seal does not match its stored head event's hash, or whose state
    or topic was changed after sealing, is not one the ledger took."""
    return event_hash(head_hash, originator_id, version, topic, state)


def topic_header(topic: str) -> bytes:
    """The topic as hashed: its UTF-8 length in 4 bytes, then its UTF-8 bytes."""
    encoded = topic.encode()
    return len(encoded).to_bytes(4, "big") + encoded


def link_hash(prev: bytes, id_bytes: bytes, version: int, header: bytes, state: bytes) -> bytes:
    """``event_hash`` from the aggregate id's 16 bytes and ``topic_header(topic)``: for a
    replay that reads ids as bytes and reuses each topic's header."""
    return sha256(b"".join((prev, id_bytes, version.to_bytes(8, "big"), header, state))).digest()


@dataclass(frozen=True)
class ChainLink:
    """One stored event of an aggregate, as read back with its hashes."""

    originator_id: UUID
    version: int
    topic: str
    state: bytes
    prev_hash: bytes | None
    hash: bytes | None


@dataclass(frozen=True)
class ChainBreak:
    """Where an aggregate's history is not what was written: version and what is wrong."""

    originator_id: UUID
    version: int
    problem: str

    def __str__(self) -> str:
        return f"{self.originator_id} v{self.version}: {self.problem}"


def check_chain(links: Iterable[ChainLink]) -> list[ChainBreak]:
    """Every break in one aggregate's events, given in version order.

    Names a missing version (deleted), an event whose content does not match its hash
    (edited) and an event that does not link to the one before it.
    """
    breaks: list[ChainBreak] = []
    expected_version, prev = 1, GENESIS
    for link in links:
        problem = link_problem(link, expected_version, prev)
        if problem is not None:
            breaks.append(ChainBreak(link.originator_id, link.version, problem))
        expected_version, prev = link.version + 1, link.hash or GENESIS
    return breaks


def link_problem(link: ChainLink, expected_version: int, prev: bytes) -> str | None:
    """What is wrong with ``link`` after an event whose hash was ``prev`` (None: nothing)."""
    if link.hash is None or link.prev_hash is None:
        return "no hash stored"
    if link.version != expected_version:
        missing = (
            f"version {expected_version}"
            if link.version == expected_version + 1
            else f"versions {expected_version}-{link.version - 1}"
        )
        return f"{missing} missing (deleted)"
    if link.prev_hash != prev:
        return "does not link to the previous event (a previous event was changed or replaced)"
    if event_hash(prev, link.originator_id, link.version, link.topic, link.state) != link.hash:
        return "content does not match its hash (edited)"
    return None
