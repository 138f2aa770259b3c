"""``domain.chain``: each event's hash covers its content and its predecessor's hash."""

from __future__ import annotations

import hashlib
from dataclasses import replace
from uuid import UUID

from domain.chain import GENESIS, ChainLink, check_chain, event_hash, snapshot_seal

AGG = UUID("00000000-0000-0000-0000-0000000000aa")


def _chain(n: int, originator_id: UUID = AGG) -> list[ChainLink]:
    links, prev = [], GENESIS
    for version in range(1, n + 1):
        topic, state = f"t.E{version}", f'{{"amount":{version}}}'.encode()
        digest = event_hash(prev, originator_id, version, topic, state)
        links.append(ChainLink(originator_id, version, topic, state, prev, digest))
        prev = digest
    return links


def test_the_hash_is_sha256_of_prev_id_version_topic_and_state() -> None:
    expected = hashlib.sha256(
        GENESIS + AGG.bytes + (1).to_bytes(8, "big") + (3).to_bytes(4, "big") + b"t.E" + b"{}"
    ).digest()
    assert event_hash(GENESIS, AGG, 1, "t.E", b"{}") == expected
    assert len(GENESIS) == 32 and GENESIS == b"\0" * 32


def test_every_input_changes_the_hash() -> None:
    base = event_hash(GENESIS, AGG, 1, "t.E", b"{}")
    assert base != event_hash(b"\1" * 32, AGG, 1, "t.E", b"{}")
    assert base != event_hash(GENESIS, UUID(int=1), 1, "t.E", b"{}")
    assert base != event_hash(GENESIS, AGG, 2, "t.E", b"{}")
    assert base != event_hash(GENESIS, AGG, 1, "t.F", b"{}")
    assert base != event_hash(GENESIS, AGG, 1, "t.E", b"{ }")
    # The topic's length is hashed too: moving bytes between topic and state shows.
    assert event_hash(GENESIS, AGG, 1, "ab", b"c") != event_hash(GENESIS, AGG, 1, "a", b"bc")


def test_a_snapshot_seal_is_the_event_hash_over_its_head_events_hash() -> None:
    head = event_hash(GENESIS, AGG, 1, "t.E", b"{}")
    seal = snapshot_seal(head, AGG, 1, "t.Snapshot", b'{"limit":800}')
    assert seal == event_hash(head, AGG, 1, "t.Snapshot", b'{"limit":800}')
    assert seal != snapshot_seal(head, AGG, 1, "t.Snapshot", b'{"limit":null}')
    assert seal != snapshot_seal(GENESIS, AGG, 1, "t.Snapshot", b'{"limit":800}')
    assert seal != snapshot_seal(head, AGG, 2, "t.Snapshot", b'{"limit":800}')


def test_an_intact_chain_has_no_breaks() -> None:
    assert check_chain(_chain(5)) == []


def test_an_edited_event_is_named_by_aggregate_and_version() -> None:
    links = _chain(4)
    links[2] = replace(links[2], state=b'{"amount":999}')
    breaks = check_chain(links)
    assert [(b.originator_id, b.version) for b in breaks] == [(AGG, 3)]
    assert "edited" in breaks[0].problem


def test_a_deleted_event_is_named_by_the_missing_version() -> None:
    links = _chain(5)
    del links[1]
    breaks = check_chain(links)
    assert [(b.version, b.problem) for b in breaks] == [(3, "version 2 missing (deleted)")]
    del links[0]  # versions 1 and 2 gone
    assert str(check_chain(links)[0]) == f"{AGG} v3: versions 1-2 missing (deleted)"


def test_an_event_rehashed_after_an_edit_breaks_the_link_to_its_successor() -> None:
    links = _chain(3)
    state = b'{"amount":999}'
    rehashed = event_hash(links[0].hash or b"", AGG, 2, links[1].topic, state)
    links[1] = replace(links[1], state=state, hash=rehashed)
    breaks = check_chain(links)
    assert [(b.version, "previous" in b.problem) for b in breaks] == [(3, True)]


def test_a_row_without_hashes_is_reported() -> None:
    links = _chain(2)
    links[1] = replace(links[1], hash=None)
    assert [b.problem for b in check_chain(links)] == ["no hash stored"]


def test_the_problems_are_worded_for_the_operator() -> None:
    edited = _chain(3)
    edited[1] = replace(edited[1], state=b'{"amount":999}')
    assert [b.problem for b in check_chain(edited)] == ["content does not match its hash (edited)"]
    relinked = _chain(3)
    state = b'{"amount":999}'
    relinked[1] = replace(
        relinked[1], state=state, hash=event_hash(relinked[0].hash or b"", AGG, 2, "t.E2", state)
    )
    assert [str(b) for b in check_chain(relinked)] == [
        f"{AGG} v3: does not link to the previous event (a previous event was changed or replaced)"
    ]
