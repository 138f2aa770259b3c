"""Fair rounds of shared work (pure): one customer's backlog delays another customer's
work by at most one round, whatever the backlog's size.

Work that several customers share (the records a usage consumer has read, the charges
a line push records) is done in rounds of bounded size. ``fair_shares`` splits a
round max-min fairly: every customer with work waiting is offered an equal share, the
ones that need less get all they need, and what they leave is split again among the
rest; a customer alone gets the whole round, so no capacity is wasted. ``fair_round``
takes each customer's share from the front of its own work, so a customer's items keep
their order and only the order *between* customers changes. While a round's
``capacity`` is at least the number of customers waiting, every customer waiting gets
at least one item into every round.

``committable`` is what reordering a log costs: a consumer that did some records past
others it still holds may only commit, per partition, up to its first record not done,
so a crash hands every record not done to the next reader again (which finds the ones
done already recorded, by their deterministic ids); once none is held, it commits past
everything it read.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from typing import TypeVar

__all__ = ["committable", "fair_round", "fair_shares"]

K = TypeVar("K", bound=Hashable)
T = TypeVar("T")


def fair_shares(demands: Mapping[K, int], capacity: int) -> dict[K, int]:
    """How many items each customer gets of a round of ``capacity`` (max-min fair).

    Customers are served from the smallest demand up (ties: in ``demands``' order, the
    longest waiting first), each offered the rest of the round split equally among the
    customers not yet served, rounded up. The shares add up to
    ``min(capacity, sum of demands)``."""
    if capacity < 1:
        raise ValueError(f"a round needs a capacity of at least 1, not {capacity}")
    order = sorted(enumerate(demands.items()), key=lambda e: (e[1][1], e[0]))
    shares: dict[K, int] = {}
    left = capacity
    for served, (_, (customer, demand)) in enumerate(order):
        offer = -(-left // (len(order) - served))  # ceil: the longest waiting get the rest
        shares[customer] = min(max(demand, 0), offer)
        left -= shares[customer]
    return {customer: shares[customer] for customer in demands}


def fair_round(
    items: Sequence[T], owner: Callable[[T], K], capacity: int
) -> tuple[list[T], list[T]]:
    """The items of the next round and the items left waiting, both in ``items``' order:
    each owner's fair share (``fair_shares``) taken from the front of its own items."""
    demands: dict[K, int] = {}
    for item in items:
        key = owner(item)
        demands[key] = demands.get(key, 0) + 1
    shares = fair_shares(demands, capacity)
    taken: list[T] = []
    waiting: list[T] = []
    for item in items:
        key = owner(item)
        if shares[key] > 0:
            shares[key] -= 1
            taken.append(item)
        else:
            waiting.append(item)
    return taken, waiting


def committable(
    done: Iterable[tuple[K, int]],
    waiting: Iterable[tuple[K, int]],
    read_to: Mapping[K, int] | None = None,
) -> dict[K, int]:
    """The offset to commit for each partition with a record ``done`` (records as
    ``(partition, offset)``): past the last record done, or past every record read
    (``read_to``: the offset after the last one read, when every record read is either
    done or ``waiting``), but never past the first record of that partition still
    waiting."""
    read_to = read_to or {}
    first_waiting: dict[K, int] = {}
    for partition, offset in waiting:
        first_waiting[partition] = min(offset, first_waiting.get(partition, offset))
    commits: dict[K, int] = {}
    for partition, offset in done:
        commits[partition] = max(offset + 1, commits.get(partition, 0), read_to.get(partition, 0))
    return {
        partition: min(offset, first_waiting.get(partition, offset))
        for partition, offset in commits.items()
    }
