"""Claims of a partition (``domain.ownership``) and the fence they put on a line's
pushes (``LinePush.start_attempt``), the ledger that records them, and the consumer
listener that claims what it is given (``adapters.charging.ownership``)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import uuid4

import psycopg
import pytest
from kafka import TopicPartition

from adapters.charging.ownership import Ownership, partition_of
from domain.errors import IllegalTransition, StaleOwner
from domain.ids import partition_claim_id
from domain.invoice_line import LinePush
from domain.ownership import Claim, PartitionClaim
from store.errors import ConcurrencyExhausted
from store.ledger import BillingLedger
from tests.fast.fakes import memory_ledger

T = datetime(2026, 12, 1, tzinfo=UTC)
LANDS = T + timedelta(seconds=40)


def _events(push: LinePush) -> list[object]:
    return list(push.collect_events())


# -- the claims of a partition ------------------------------------------------------------


def test_each_claim_of_a_partition_is_newer_than_the_last_and_names_its_owner() -> None:
    holder = PartitionClaim(topic="billing.events", partition=3)
    assert holder.id == partition_claim_id("billing.events", 3)
    assert holder.claim("host-a:1") == Claim(3, 1)
    assert holder.claim("host-b:2") == Claim(3, 2)
    assert (holder.owner, holder.epoch) == ("host-b:2", 2)
    claimed = [e for e in holder.collect_events() if isinstance(e, PartitionClaim.Claimed)]
    assert [(e.owner, e.epoch) for e in claimed] == [("host-a:1", 1), ("host-b:2", 2)]


def test_partitions_and_topics_are_claimed_apart() -> None:
    ids = {partition_claim_id(t, p) for t in ("billing.events", "other") for p in (0, 1)}
    assert len(ids) == 4


# -- the fence on a line's pushes ---------------------------------------------------------


def test_a_first_claim_is_recorded_with_the_attempt() -> None:
    push = LinePush(line_id=uuid4())
    _events(push)
    assert push.start_attempt(1, T, LANDS, Claim(2, 5)) == 1
    [claimed, started] = _events(push)
    assert isinstance(claimed, LinePush.OwnerClaimed)
    assert (claimed.partition, claimed.epoch) == (2, 5)
    assert isinstance(started, LinePush.AttemptStarted)
    assert (push.owner_partition, push.owner_epoch) == (2, 5)


def test_the_same_claim_again_records_only_the_attempt() -> None:
    push = LinePush(line_id=uuid4())
    push.start_attempt(1, T, LANDS, Claim(2, 5))
    _events(push)
    push.start_attempt(2, T, LANDS, Claim(2, 5))
    assert [type(e) for e in _events(push)] == [LinePush.AttemptStarted]


def test_a_newer_claim_takes_the_line_over() -> None:
    push = LinePush(line_id=uuid4())
    push.start_attempt(1, T, LANDS, Claim(2, 5))
    push.start_attempt(2, T, LANDS, Claim(2, 6))
    assert (push.owner_partition, push.owner_epoch) == (2, 6)
    assert push.fenced_out(Claim(2, 5))
    assert not push.fenced_out(Claim(2, 6))


def test_an_older_claim_of_the_same_partition_is_refused_and_records_nothing() -> None:
    push = LinePush(line_id=uuid4())
    push.start_attempt(1, T, LANDS, Claim(2, 6))
    _events(push)
    with pytest.raises(StaleOwner, match="claim 6 of partition 2") as refused:
        push.start_attempt(2, T, LANDS, Claim(2, 5))
    assert isinstance(refused.value, IllegalTransition)  # the pusher reloads on it
    assert _events(push) == []
    assert push.attempts_started == 1


def test_a_push_without_a_claim_is_never_refused_and_takes_nothing_over() -> None:
    push = LinePush(line_id=uuid4())
    push.start_attempt(1, T, LANDS, Claim(2, 6))
    assert not push.fenced_out(None)
    push.start_attempt(2, T, LANDS)
    assert (push.owner_partition, push.owner_epoch) == (2, 6)


def test_a_claim_of_another_partition_is_taken_as_newer_whatever_its_epoch() -> None:
    # The topic was given more partitions: the customer's lines moved with their key.
    push = LinePush(line_id=uuid4())
    push.start_attempt(1, T, LANDS, Claim(2, 6))
    assert not push.fenced_out(Claim(7, 1))
    push.start_attempt(2, T, LANDS, Claim(7, 1))
    assert (push.owner_partition, push.owner_epoch) == (7, 1)


def test_a_sealed_push_is_refused_before_its_claim_is_looked_at() -> None:
    push = LinePush(line_id=uuid4())
    push.start_attempt(1, T, LANDS, Claim(2, 6))
    push.seal(uuid4())
    _events(push)
    with pytest.raises(IllegalTransition, match="sealed") as refused:
        push.start_attempt(2, T, LANDS, Claim(2, 9))
    assert not isinstance(refused.value, StaleOwner)
    assert _events(push) == []


def test_a_push_recorded_before_claims_existed_holds_no_claim() -> None:
    push = LinePush(line_id=uuid4())
    push.start_attempt(1, T, LANDS)
    assert "owner_epoch" not in push.__dict__  # as a snapshot taken before claims loads
    assert (push.owner_partition, push.owner_epoch) == (None, 0)
    assert not push.fenced_out(Claim(0, 1))


# -- the ledger records them --------------------------------------------------------------


def test_the_ledger_numbers_the_claims_of_each_partition() -> None:
    ledger = memory_ledger()
    assert ledger.claim_partition("billing.events", 0, "a:1") == Claim(0, 1)
    assert ledger.claim_partition("billing.events", 1, "a:1") == Claim(1, 1)
    assert ledger.claim_partition("billing.events", 0, "b:2") == Claim(0, 2)
    holder: PartitionClaim = ledger.repository.get(partition_claim_id("billing.events", 0))
    assert (holder.owner, holder.epoch) == ("b:2", 2)


class _Racing(BillingLedger):
    """A ledger whose next saves are each beaten by another claimant of the partition."""

    races = 0
    _rival = False

    def save(self, *objs: Any, **kwargs: Any) -> Any:
        if self.races and not self._rival:
            self.races -= 1
            self._rival = True
            try:
                super().claim_partition("billing.events", 0, "rival:9")
            finally:
                self._rival = False
        return super().save(*objs, **kwargs)


def _racing() -> _Racing:
    plain = memory_ledger()
    return _Racing(plain.prices, env={"PERSISTENCE_MODULE": "eventsourcing.popo"})


def test_a_claimant_that_loses_the_race_claims_again_after_the_winner() -> None:
    ledger = _racing()
    ledger.races = 1
    assert ledger.claim_partition("billing.events", 0, "a:1") == Claim(0, 2)
    holder: PartitionClaim = ledger.repository.get(partition_claim_id("billing.events", 0))
    assert holder.owner == "a:1"


def test_a_claimant_beaten_every_time_gives_up_with_a_store_error() -> None:
    ledger = _racing()
    ledger.races = ledger.max_attempts
    with pytest.raises(ConcurrencyExhausted, match=r"partition 0 of billing\.events"):
        ledger.claim_partition("billing.events", 0, "a:1")


# -- the consumer's listener claims what it is given ---------------------------------------


def _customer_in(partition: int, partitions: int = 4) -> str:
    return next(
        c for c in (f"c{i}" for i in range(1000)) if partition_of(c, partitions) == partition
    )


def _assigned(*partitions: int, topic: str = "billing.events") -> Sequence[TopicPartition]:
    return [TopicPartition(topic, p) for p in partitions]


def test_a_partition_given_is_claimed_and_its_customers_pushed_under_the_claim() -> None:
    asked: list[int] = []

    def claim(partition: int) -> Claim:
        asked.append(partition)
        return Claim(partition, 10 + partition)

    owner = Ownership("billing.events", 4, timedelta(minutes=2), claim=claim)
    owner.on_partitions_assigned([*_assigned(3, 1), TopicPartition("other", 0)])
    assert asked == [1, 3]
    assert owner.held == frozenset({1, 3})
    assert owner.claim_for(_customer_in(3)) == Claim(3, 13)
    assert owner.claim_for(_customer_in(1)) == Claim(1, 11)
    assert owner.claim_for(_customer_in(0)) is None  # not held: not fenced


def test_a_partition_taken_away_takes_its_claim_with_it() -> None:
    owner = Ownership("billing.events", 4, timedelta(minutes=2), claim=lambda p: Claim(p, 1))
    owner.on_partitions_assigned(_assigned(0, 2))
    owner.on_partitions_revoked([*_assigned(2), TopicPartition("other", 0)])
    assert owner.claim_for(_customer_in(2)) is None
    assert owner.claim_for(_customer_in(0)) == Claim(0, 1)
    owner.on_partitions_assigned(_assigned(0))
    assert owner.claim_for(_customer_in(0)) == Claim(0, 1)


def test_a_claim_the_database_cannot_record_leaves_the_partition_held_unfenced() -> None:
    def claim(partition: int) -> Claim:
        if partition == 1:
            raise psycopg.OperationalError("connection refused")
        raise ConcurrencyExhausted("raced")

    owner = Ownership("billing.events", 4, timedelta(minutes=2), claim=claim)
    owner.on_partitions_assigned(_assigned(1, 2))
    assert owner.held == frozenset({1, 2})
    assert owner.claim_for(_customer_in(1)) is None
    assert owner.claim_for(_customer_in(2)) is None


def test_without_a_claimant_partitions_are_held_without_claims() -> None:
    owner = Ownership("billing.events", 4, timedelta(minutes=2))
    owner.on_partitions_assigned(_assigned(1))
    assert owner.held == frozenset({1})
    assert owner.claim_for(_customer_in(1)) is None


def test_a_claim_failing_for_another_reason_is_not_swallowed() -> None:
    def claim(partition: int) -> Claim:
        raise RuntimeError("a bug")

    owner = Ownership("billing.events", 4, timedelta(minutes=2), claim=claim)
    with pytest.raises(RuntimeError, match="a bug"):
        owner.on_partitions_assigned(_assigned(1))
