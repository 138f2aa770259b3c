"""``domain.fairness``: a round is split max-min fairly between customers, each
customer's items keep their order, and a reordered log is committed only up to its
first record not done."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from domain.fairness import committable, fair_round, fair_shares


def test_a_customer_alone_gets_the_whole_round() -> None:
    assert fair_shares({"burst": 12_000}, 2000) == {"burst": 2000}


def test_small_demands_are_met_in_full_and_the_backlog_gets_the_rest() -> None:
    demands = {"burst": 12_000, "a": 3, "b": 1, "c": 7}
    assert fair_shares(demands, 2000) == {"burst": 1989, "a": 3, "b": 1, "c": 7}


def test_equal_backlogs_split_the_round_equally_the_longest_waiting_first() -> None:
    assert fair_shares({"x": 100, "y": 100, "z": 100}, 10) == {"x": 4, "y": 3, "z": 3}
    assert fair_shares({"x": 2, "y": 100, "z": 100}, 10) == {"x": 2, "y": 4, "z": 4}


def test_ties_go_to_the_longest_waiting_whatever_the_customers_keys() -> None:
    """By who waits longest (the demands' order), never by the keys: real keys are
    bytes or None (a record without a key), which do not even sort together."""
    assert fair_shares({"z": 100, "a": 100}, 5) == {"z": 3, "a": 2}
    assert fair_shares({None: 100, b"acme": 100, b"zeta": 100}, 7) == {
        None: 3, b"acme": 2, b"zeta": 2,
    }  # fmt: skip


def test_a_round_smaller_than_the_customers_serves_the_longest_waiting() -> None:
    assert fair_shares({"a": 1, "b": 1, "c": 1}, 2) == {"a": 1, "b": 1, "c": 0}


def test_a_round_needs_room_for_one_item() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        fair_shares({"a": 1}, 0)


@given(
    st.dictionaries(st.text(max_size=3), st.integers(0, 50), max_size=12),
    st.integers(1, 200),
)
def test_shares_fill_the_round_and_none_gets_more_than_an_equal_split_while_others_wait(
    demands: dict[str, int], capacity: int
) -> None:
    shares = fair_shares(demands, capacity)
    assert set(shares) == set(demands)
    assert sum(shares.values()) == min(capacity, sum(demands.values()))
    for customer, share in shares.items():
        assert 0 <= share <= demands[customer]
    # Max-min fair: a customer left wanting never got fewer than any other customer
    # (but for the one item of rounding), so nobody's backlog starves another.
    for starved, share in shares.items():
        if share < demands[starved]:
            assert all(other <= share + 1 for other in shares.values())


def test_a_round_takes_each_customers_share_from_the_front_keeping_the_order() -> None:
    items = [("burst", i) for i in range(6)] + [("a", 0), ("burst", 6), ("a", 1), ("b", 0)]
    taken, waiting = fair_round(items, lambda item: item[0], 5)
    assert taken == [("burst", 0), ("burst", 1), ("a", 0), ("a", 1), ("b", 0)]
    assert waiting == [("burst", i) for i in range(2, 7)]


def test_a_customer_behind_a_burst_is_in_the_next_round_not_after_the_burst() -> None:
    items = [("burst", i) for i in range(12_000)] + [("late", 0)]
    taken, waiting = fair_round(items, lambda item: item[0], 2000)
    assert ("late", 0) in taken
    assert len(taken) == 2000 and len(waiting) == 12_000 - 1999


def test_commits_stop_at_the_first_record_of_a_partition_still_waiting() -> None:
    done = [("p0", 0), ("p0", 5), ("p1", 3), ("p2", 9)]
    waiting = [("p0", 2), ("p0", 1), ("p1", 7), ("p3", 4)]
    assert committable(done, waiting) == {"p0": 1, "p1": 4, "p2": 10}


def test_commits_pass_the_batch_when_nothing_waits() -> None:
    assert committable([("p0", 3), ("p0", 8), ("p0", 4)], []) == {"p0": 9}


def test_commits_pass_what_was_done_before_once_nothing_before_it_waits() -> None:
    # Offsets 0-9 read; 3 done in an earlier round; now 0-2 and 4-9 are done.
    done = [("p0", o) for o in (0, 1, 2, 4, 5)]
    assert committable(done, [("p0", 6)], {"p0": 10}) == {"p0": 6}
    assert committable([("p0", o) for o in (6, 7, 8, 9)], [], {"p0": 10}) == {"p0": 10}
    assert committable([("p0", 2)], [], {"p1": 10}) == {"p0": 3}
