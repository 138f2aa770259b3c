"""``billing.dead_letters`` against a real PostgreSQL: bounded rows, exact counts, and
retention that removes old rows without changing what is counted (issue 11)."""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Iterator

import psycopg
import pytest

from adapters.bootstrap import build_retention, migrate
from adapters.settings import Settings
from domain.ports import DeadLetter
from projections.queue_health import read_health
from store.connections import Database
from store.dead_letters import PAYLOAD_PREFIX_BYTES, DeadLetterStore

pytestmark = pytest.mark.integration


@pytest.fixture
def store(settings: Settings) -> Iterator[DeadLetterStore]:
    migrate(settings)
    yield DeadLetterStore(Database(settings.database_url))


def _letter(offset: int, payload: bytes | None = b"[]", code: str = "not_object") -> DeadLetter:
    return DeadLetter("usage", 0, offset, b"acme", payload, f"{code} at {offset}", code=code)


def _table_bytes(url: str) -> int:
    with psycopg.connect(url) as conn:
        row = conn.execute(
            "SELECT coalesce(sum(octet_length(payload)), 0) FROM billing.dead_letters"
        ).fetchone()
    assert row is not None
    return int(row[0])


def test_an_oversized_letter_keeps_a_prefix_with_the_whole_size_and_hash(
    settings: Settings, store: DeadLetterStore
) -> None:
    big = b"{" + b"x" * 900_000 + b"}"
    # 40 x 900 KB added 36 MB to the table before issue 11.
    assert store.record([_letter(i, big, "oversized") for i in range(40)]) == 40
    assert _table_bytes(settings.database_url) == 40 * PAYLOAD_PREFIX_BYTES

    letter = next(d for d in store.all() if d.offset == 7)
    assert letter.payload == big[:PAYLOAD_PREFIX_BYTES]
    assert letter.payload_size == len(big)
    assert letter.payload_sha256 == hashlib.sha256(big).hexdigest()
    assert letter.code == "oversized"


def test_a_small_letter_and_a_letter_without_a_value_are_kept_whole(
    store: DeadLetterStore,
) -> None:
    store.record([_letter(1, b"[1]"), _letter(2, None, "empty")])
    by_offset = {d.offset: d for d in store.all()}
    assert (by_offset[1].payload, by_offset[1].payload_size) == (b"[1]", 3)
    assert (by_offset[2].payload, by_offset[2].payload_size, by_offset[2].payload_sha256) == (
        None,
        None,
        None,
    )


def test_a_letter_recorded_again_is_stored_and_counted_once(store: DeadLetterStore) -> None:
    letters = [_letter(i) for i in range(5)]
    assert store.record(letters) == 5
    assert store.record([*letters[2:], _letter(5, code="not_json")]) == 1  # a redelivery
    assert store.count() == 6
    assert store.counts() == {("usage", "not_object"): 5, ("usage", "not_json"): 1}


def test_letters_recorded_concurrently_are_all_counted(store: DeadLetterStore) -> None:
    def write(worker: int) -> None:
        for batch in range(10):
            store.record([_letter(worker * 1000 + batch * 10 + i) for i in range(10)])

    threads = [threading.Thread(target=write, args=(w,)) for w in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert store.count() == 400 == len(store.all(limit=1000))


def test_retention_removes_only_old_letters_a_batch_at_a_time_and_the_counts_stay(
    settings: Settings, store: DeadLetterStore
) -> None:
    store.record([_letter(i) for i in range(25)])
    with psycopg.connect(settings.database_url) as conn:  # 20 of them arrived 40 days ago
        conn.execute(
            "UPDATE billing.dead_letters SET received_at = now() - interval '40 days'"
            " WHERE source_offset < 20"
        )
    retention = build_retention(settings.model_copy(update={"dead_letter_retention_days": 30}))
    retention.batch, retention.pause_s = 6, 0.0

    assert retention.sweep(threading.Event()) == 20  # in four statements of at most six
    assert sorted(d.offset for d in store.all()) == list(range(20, 25))
    assert store.count() == 25  # what arrived, whatever was removed since
    assert retention.sweep(threading.Event()) == 0
    with psycopg.connect(settings.database_url) as conn:
        assert read_health(conn)["dead_letters_last_hour"] == 5


def test_retention_of_zero_days_keeps_everything(
    settings: Settings, store: DeadLetterStore
) -> None:
    store.record([_letter(0)])
    with psycopg.connect(settings.database_url) as conn:
        conn.execute("UPDATE billing.dead_letters SET received_at = now() - interval '9 years'")
    retention = build_retention(settings.model_copy(update={"dead_letter_retention_days": 0}))
    assert retention.sweep(threading.Event()) == 0
    assert len(store.all()) == 1
