"""The per-invoice push decided without I/O: which lines go in a draft's bulk update,
how they are grouped into requests, the request's key, and the line items a LinePush
learns from Stripe."""

from __future__ import annotations

from uuid import UUID, uuid4

import pytest

from domain.invoice_line import LinePush
from domain.pushing import (
    MAX_LINES_PER_UPDATE,
    ItemStep,
    LineAdd,
    LinePart,
    LineSet,
    PushPlan,
    add_key,
    batches,
    invoice_part,
    lines_key,
    planned_push,
)

A = UUID(int=1)
B = UUID(int=2)


def _plan(*steps: ItemStep, sequence: int = 5, repair: int = 0) -> PushPlan:
    return PushPlan(sequence, sum(s.amount for s in steps), steps, (), repair)


def test_a_line_whose_items_exist_and_line_items_are_known_sets_only_its_changed_items() -> None:
    plan = _plan(ItemStep(0, 99, "ii_a", update=False), ItemStep(1, 7, "ii_b", update=True))
    part = invoice_part(A, plan, ["il_x", "il_y"])
    assert part == LinePart(A, plan, (LineSet(A, 1, "il_y", 7, 5),))


def test_a_first_push_or_unknown_line_items_go_on_their_own() -> None:
    creation = _plan(ItemStep(0, 5, None, 5, 5, update=False))
    assert invoice_part(A, creation, ["il_x"]) is None  # an item to create: per line
    update = _plan(ItemStep(0, 9, "ii_a", update=True))
    assert invoice_part(A, update, None) is None  # not learned from Stripe yet
    assert invoice_part(A, update, []) is None
    assert invoice_part(A, _plan(ItemStep(0, 9, "ii_a", update=False)), ["il_x"]) is None


def test_a_repair_is_in_each_line_item_it_sets() -> None:
    plan = _plan(ItemStep(0, 9, "ii_a", update=True), repair=2)
    part = invoice_part(A, plan, ["il_x"])
    assert part is not None and part.sets == (LineSet(A, 0, "il_x", 9, 5, 2),)


def _part(line: UUID, items: int, sequence: int = 5) -> LinePart:
    sets = tuple(LineSet(line, n, f"il_{line.int}_{n}", n, sequence) for n in range(items))
    return LinePart(line, PushPlan(sequence, 0, (), ()), sets)


def test_batches_keep_each_line_whole_in_order_and_at_most_the_bound() -> None:
    parts = [_part(UUID(int=n), 2) for n in range(1, 6)]
    assert batches(parts, maximum=4) == [tuple(parts[0:2]), tuple(parts[2:4]), (parts[4],)]
    assert batches(parts, maximum=5) == [tuple(parts[0:2]), tuple(parts[2:4]), (parts[4],)]
    assert batches(parts) == [tuple(parts)]
    assert batches([]) == []


def test_a_line_with_more_items_than_one_request_takes_is_left_to_its_own_push() -> None:
    big, small = _part(A, MAX_LINES_PER_UPDATE + 1), _part(B, 1)
    assert batches([big, small]) == [(small,)]
    assert batches([_part(A, MAX_LINES_PER_UPDATE)]) == [(_part(A, MAX_LINES_PER_UPDATE),)]


def test_the_key_is_the_invoice_and_what_is_set_in_any_order_never_a_clock() -> None:
    invoice = uuid4()
    a, b = _part(A, 1), _part(B, 2)
    key = lines_key(invoice, [a, b])
    assert key.startswith(f"invoice-lines:{invoice}:") and len(key.rsplit(":", 1)[1]) == 32
    assert lines_key(invoice, [b, a]) == key
    assert lines_key(uuid4(), [a, b]) != key
    assert lines_key(invoice, [a, _part(B, 2, sequence=6)]) != key  # another sequence
    assert lines_key(invoice, [a]) != key  # another set of lines
    repaired = LinePart(A, a.plan, (LineSet(A, 0, "il_1_0", 0, 5, 1),))
    assert lines_key(invoice, [repaired, b]) != key  # a repair is a request of its own


def test_a_push_learns_the_line_items_of_its_own_items_only_and_once() -> None:
    push = LinePush(line_id=A)
    push.record_pushed(1, 10, [6, 4], ["ii_a", "ii_b"], "in_1")
    assert push.line_item_ids() is None
    push.learn_line_items({"ii_a": "il_1", "ii_other": "il_9"})
    assert push.line_item_ids() is None  # ii_b not listed yet
    push.learn_line_items({"ii_a": "il_1", "ii_b": "il_2"})
    assert push.line_item_ids() == ["il_1", "il_2"]
    learned = [e for e in push.collect_events() if isinstance(e, LinePush.LineItemsLearned)]
    assert [(e.item_ids, e.line_item_ids) for e in learned] == [
        (["ii_a"], ["il_1"]),
        (["ii_b"], ["il_2"]),
    ]
    push.learn_line_items({"ii_a": "il_1", "ii_b": "il_2"})
    assert not push.collect_events()  # nothing new: nothing recorded
    replayed = LinePush(line_id=A)
    assert replayed.line_item_ids() is None and replayed.learned_line_items is None


def test_the_key_is_pinned_so_a_new_release_replays_what_an_old_one_sent() -> None:
    # A retry after an upgrade must send the key the first attempt sent: its digest is
    # of "line:chunk:sequence:repair" texts, sorted, joined by "|", sha256, 32 hex digits.
    sets = (LineSet(A, 0, "il_x", 7, 5), LineSet(A, 1, "il_y", 8, 5, 2))
    part = LinePart(A, PushPlan(5, 15, (), ()), sets)
    assert lines_key(UUID(int=9), [part]) == (
        "invoice-lines:00000000-0000-0000-0000-000000000009:26625183d6ddbbffb6aa08a6bd5fba90"
    )


# -- new lines together: ``add_lines`` ------------------------------------------------------


def _adds() -> list[LineAdd]:
    return [
        LineAdd(A, "api.requests", "2026-11", ((0, 5, 300), (1, 6, 200))),
        LineAdd(B, "api.requests", "2026-11", ((0, 3, 70),)),
    ]


def test_the_add_key_is_the_set_created_in_any_order_and_pinned_across_releases() -> None:
    # A retry after an upgrade sends the key the first attempt sent: its digest is of
    # "line:chunk:sequence:amount" texts, sorted, joined by "|", sha256, 32 hex digits.
    a, b = _adds()
    key = add_key(UUID(int=9), [a, b])
    assert key == (
        "invoice-add:00000000-0000-0000-0000-000000000009:03262afd09e94189db8c1919fdfa4afc"
    )
    assert add_key(UUID(int=9), [b, a]) == key
    assert add_key(UUID(int=9), [a]) != key  # a part found made already: another request
    assert add_key(UUID(int=8), [a, b]) != key


def test_a_made_batch_holds_its_planned_items_at_the_newest_planned_sequence() -> None:
    push = LinePush(line_id=A)
    push.plan_item(0, 5, 300)
    push.plan_item(1, 6, 200)
    assert planned_push(push, ["ii_a", "ii_b"]) == PushPlan(
        6, 500, (ItemStep(0, 300, "ii_a"), ItemStep(1, 200, "ii_b")), ()
    )
    assert planned_push(push, ["ii_a"]) == PushPlan(5, 300, (ItemStep(0, 300, "ii_a"),), ())
    assert planned_push(push, []) == PushPlan(0, 0, (), ())  # nothing made: nothing held
    with pytest.raises(ValueError, match="zip"):  # more items than were planned
        planned_push(push, ["ii_a", "ii_b", "ii_c"])
