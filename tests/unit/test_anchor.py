"""``domain.anchor``: the global chain over the log, signed checkpoints of it, and the
check that folds the log again against them (every kind of change it must see)."""

from __future__ import annotations

import hmac
import json
from hashlib import sha256

import pytest

from domain.anchor import AnchorCheck, AnchorFinding, BadCheckpoint, Checkpoint, GlobalChain
from domain.chain import GENESIS, link_hash, topic_header

KEY = b"k" * 32
SIGNATURE = r"^signature does not verify \(another key, or edited\)$"
A, B = bytes(range(16)), bytes(range(16, 32))
LOG = [
    (A, 1, "billing.A", b'{"s":1}', 100, 1),
    (A, 2, "billing.A", b'{"s":2}', 100, 2),
    (B, 1, "billing.B", b'{"s":3}', 101, 3),
    (B, 2, "billing.B", b'{"s":4}', 103, 7),
    (A, 3, "billing.A", b'{"s":5}', 104, 8),
]


def _cp(n: int, at: str) -> Checkpoint:
    """The checkpoint after the first ``n`` events of LOG."""
    chain = GlobalChain()
    for entry in LOG[:n]:
        chain.add(entry)
    return chain.checkpoint(at)


# -- the global chain -----------------------------------------------------------------------


def test_the_chain_links_each_events_content_to_the_head_before_it() -> None:
    chain = GlobalChain()
    assert (chain.events, chain.xid, chain.notification_id, chain.head) == (0, 0, 0, GENESIS)
    chain.add(LOG[0])
    chain.add(LOG[2])
    chain.add(LOG[1])  # the same topic again: the same header
    one = link_hash(GENESIS, A, 1, topic_header("billing.A"), b'{"s":1}')
    two = link_hash(one, B, 1, topic_header("billing.B"), b'{"s":3}')
    three = link_hash(two, A, 2, topic_header("billing.A"), b'{"s":2}')
    assert (chain.events, chain.xid, chain.notification_id, chain.head) == (3, 100, 2, three)


def test_a_checkpoint_records_count_position_and_head_and_the_chain_resumes_from_it() -> None:
    cp = _cp(3, "2026-12-03T10:00:00+00:00")
    full = GlobalChain()
    for entry in LOG:
        full.add(entry)
    assert (cp.events, cp.xid, cp.notification_id, cp.at) == (
        3,
        101,
        3,
        "2026-12-03T10:00:00+00:00",
    )
    assert cp.position == (101, 3)
    resumed = GlobalChain.after(cp)
    assert (resumed.events, resumed.xid, resumed.notification_id, resumed.head.hex()) == (
        3,
        101,
        3,
        cp.head,
    )
    for entry in LOG[3:]:
        resumed.add(entry)
    assert (resumed.events, resumed.head) == (5, full.head)
    fresh = GlobalChain.after(None)
    assert (fresh.events, fresh.xid, fresh.notification_id, fresh.head) == (0, 0, 0, GENESIS)


# -- signed checkpoints ---------------------------------------------------------------------


def test_a_checkpoint_line_is_its_fields_and_an_hmac_of_their_canonical_json() -> None:
    cp = Checkpoint(5, 104, 8, "ab" * 32, "2026-12-03T10:00:00+00:00")
    payload = (
        '{"at":"2026-12-03T10:00:00+00:00","events":5,"head":"' + "ab" * 32 + '",'
        '"notification_id":8,"v":1,"xid":104}'
    ).encode()
    mac = hmac.new(KEY, payload, sha256).hexdigest()
    line = cp.signed_line(KEY)
    assert line == (
        '{"at": "2026-12-03T10:00:00+00:00", "events": 5, "head": "'
        + "ab" * 32
        + '", "mac": "'
        + mac
        + '", "notification_id": 8, "v": 1, "xid": 104}'
    )
    assert Checkpoint.verified(line, KEY) == cp


def _line(**changes: object) -> str:
    data = json.loads(_cp(2, "t").signed_line(KEY))
    data.update(changes)
    return json.dumps({k: v for k, v in data.items() if v is not None})


@pytest.mark.parametrize(
    ("line", "key", "message"),
    [
        (_cp(2, "t").signed_line(KEY), b"x" * 32, SIGNATURE),
        (_line(events=3), KEY, SIGNATURE),
        (_line(at="u"), KEY, SIGNATURE),
        (_line(mac=5), KEY, SIGNATURE),
        (_line(v=2), KEY, "^not a checkpoint: unknown checkpoint version$"),
        (_line(xid="x"), KEY, "^not a checkpoint: invalid literal"),
        (_line(mac=None), KEY, "^not a checkpoint: 'mac'$"),
        (_line(head=None), KEY, "^not a checkpoint: 'head'$"),
        ("[1, 2]", KEY, "^not a checkpoint: "),
        ("not json", KEY, "^not a checkpoint: "),
    ],
)
def test_a_line_not_signed_with_the_key_or_malformed_is_refused(
    line: str, key: bytes, message: str
) -> None:
    with pytest.raises(BadCheckpoint, match=message):
        Checkpoint.verified(line, key)


def test_every_field_of_a_verified_line_is_read_as_its_type() -> None:
    cp = Checkpoint.verified(_line(), KEY)
    assert cp == _cp(2, "t")
    assert [type(v) for v in (cp.events, cp.xid, cp.notification_id, cp.head, cp.at)] == [
        int,
        int,
        int,
        str,
        str,
    ]


# -- the check ------------------------------------------------------------------------------


def test_a_history_every_checkpoint_holds_for_has_no_finding() -> None:
    cps = [_cp(4, "t4"), _cp(2, "t2")]  # out of order: sorted by position
    check = AnchorCheck(cps).run(LOG)
    assert check.finding is None
    assert check.matched == cps[0]
    assert check.unanchored == 1
    assert AnchorCheck([]).run(LOG).unanchored == 5
    assert AnchorCheck([]).run(LOG).finding is None


def test_checkpoints_at_the_same_position_are_all_checked() -> None:
    check = AnchorCheck([_cp(2, "a"), _cp(2, "b"), _cp(3, "c")]).run(LOG)
    assert check.finding is None
    assert check.matched == _cp(3, "c")


def test_an_edited_event_fails_the_first_checkpoint_after_it() -> None:
    edited = [*LOG]
    edited[2] = (B, 1, "billing.B", b'{"s":33}', 101, 3)
    check = AnchorCheck([_cp(1, "t1"), _cp(3, "t3"), _cp(5, "t5")]).run(edited)
    assert check.finding == AnchorFinding(
        "checkpoint of t3",
        "the 3 event(s) up to position (xid 101, notification 3) are not those it anchored:"
        " an event was edited or replaced (with its hash chain recomputed or not); the"
        " checkpoint of t1 (1 events) still holds, so the change is after its position",
    )
    assert check.matched == _cp(1, "t1")


def test_an_event_deleted_before_a_checkpoints_own_event_changes_the_count() -> None:
    check = AnchorCheck([_cp(3, "t3"), _cp(5, "t5")]).run([LOG[0], *LOG[2:]])
    assert check.finding == AnchorFinding(
        "checkpoint of t3",
        "2 event(s) up to position (xid 101, notification 3), where it anchored 3: events"
        " were deleted or inserted; no earlier checkpoint holds",
    )
    assert check.matched is None


def test_a_checkpoints_own_event_deleted_is_found_at_the_next_event() -> None:
    check = AnchorCheck([_cp(2, "t2"), _cp(3, "t3")]).run([LOG[0], *LOG[2:]])
    assert check.finding == AnchorFinding(
        "checkpoint of t2",
        "the event at position (xid 100, notification 2) that it anchored is gone (deleted),"
        " or its position was changed; no earlier checkpoint holds",
    )


def test_anchored_events_deleted_at_the_end_are_found() -> None:
    check = AnchorCheck([_cp(2, "t2"), _cp(4, "t4")]).run(LOG[:3])
    assert check.finding == AnchorFinding(
        "checkpoint of t4",
        "the history ends at 3 event(s), before the event at position (xid 103,"
        " notification 7) that it anchored: anchored events were deleted; the checkpoint"
        " of t2 (2 events) still holds, so the change is after its position",
    )
    assert check.unanchored == 0  # fewer events than the last checkpoint covers


def test_only_the_first_change_is_reported() -> None:
    edited = [(*e[:3], b"{}", *e[4:]) for e in LOG]
    check = AnchorCheck([_cp(1, "t1"), _cp(2, "t2"), _cp(5, "t5")]).run(edited[:4])
    assert check.finding is not None
    assert check.finding.subject == "checkpoint of t1"
    assert check.matched is None
