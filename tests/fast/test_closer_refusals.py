"""The closer's answers to refusals: a repair our own limiter refused unsent is no
repair (it does not count toward ``MAX_REPAIRS``); ``invoices close`` counts an invoice
whose read back our own breaker refused as not finalized; and a draft deleted by hand in
Stripe, which settling cannot bring back, billed on a new draft once an operator
redrafts the invoice (``adapters.charging.redraft``).

Built on the ``Parts`` harness and the strict fake Stripe of ``test_closer_pinned``.
"""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import Iterator
from typing import Any

import pytest
from eventsourcing.persistence import IntegrityError

from adapters.charging.closer import MAX_REPAIRS, CloseResult, CloseStep, InvoiceCloser
from adapters.charging.redraft import RedraftRefused, redraft
from domain.invoice_states import InvoiceState
from domain.saga import ChargeFailure
from domain.transaction import TxnState
from tests.fast.fakes import reserve
from tests.fast.test_closer_pinned import FIN, GRACE, LANDING, POLICY, Parts

S = CloseResult

THROTTLED = ChargeFailure("throttled", "Stripe rate limit saturated", retryable=True, sent=False)


def test_repairs_refused_unsent_by_our_own_limiter_do_not_count_toward_max_repairs() -> None:
    parts = Parts().bill().closed()
    parts.edit(parts.lines[0], 90)
    for _ in range(MAX_REPAIRS):  # the read goes through; the repair is refused unsent
        parts.stripe.repair_failures.append(THROTTLED)
        step = parts.step()
        assert step.result is S.WAITING  # "no attempt: nothing recorded, no backoff"
        parts.clock.now += POLICY.base_delay
    assert parts.stripe.held(parts.lines[0]) == [90]  # no repair ever reached Stripe
    # The limiter has room again: the drift is repaired by itself, as the runbook says
    # ("it stops only after repeated repairs Stripe undoes").
    step = parts.step()
    assert step.result is not S.ATTENTION, parts.invoice().attention
    assert parts.step().state is InvoiceState.FINALIZED


def test_a_draft_deleted_by_hand_is_billed_on_a_new_draft_once_an_operator_redrafts_it() -> None:
    parts = Parts().bill(two_lines=True).closed()
    lost = parts.invoice().stripe_invoice_id
    assert lost is not None
    parts.stripe.delete_draft(lost)  # deleted in the dashboard: its items with it
    assert parts.step().result is S.ATTENTION
    attention = parts.invoice().attention
    assert attention is not None and attention.startswith("Stripe refused the read back")
    # Settling alone reads the same lost id again, and stops again.
    stopped = parts.invoice()
    stopped.settle_attention("looked at the dashboard", "ops@example.com")
    parts.ledger.save(stopped)
    assert parts.step().result is S.ATTENTION

    done = redraft(parts.ledger, parts.stripe, parts.id, "deleted by mistake", "ops@example.com")
    assert (done.lost, done.draft, done.lines) == (lost, 2, 2)
    assert done.why == f"http_404: No such invoice: '{lost}'"
    again = parts.invoice()
    assert again.state is InvoiceState.CLOSED and again.stripe_invoice_id is None
    assert again.attention is None and again.draft == 2
    step = parts.step()  # the lines are handed to their pushers: nothing on the new draft
    assert step.result is S.WAITING
    assert {line for line, _ in parts.handed[-2:]} == set(parts.lines)
    for line in parts.lines:
        parts.pusher.push(line)
    made = parts.invoice().stripe_invoice_id
    assert made is not None and made != lost
    assert parts.stripe.held(parts.lines[0]) == [100] and parts.stripe.held(parts.lines[1]) == [25]
    assert f"invoice:{parts.id}:d2" in parts.stripe.executed  # the new draft's own key
    assert parts.step() == CloseStep(S.DONE, InvoiceState.FINALIZED, 2)
    final = parts.invoice()
    assert final.total == final.expected_total == 125
    assert parts.stripe.finalized[made].total == 125
    assert f"invoice-finalize:{parts.id}:d2" in parts.stripe.executed
    # Nothing was compensated: the usage was owed throughout.
    assert all(parts.ledger.transaction(t).state is TxnState.CHARGED for t in parts.txns)


def test_a_draft_deleted_while_open_stops_the_next_push_and_nothing_is_compensated() -> None:
    parts = Parts().bill(records=2)
    lost = parts.invoice().stripe_invoice_id
    assert lost is not None
    parts.stripe.delete_draft(lost)
    more = reserve(parts.ledger, 1, quantity=1000, prefix="late")  # usage goes on
    line = parts.lines[0]
    parts.pusher.push(line)  # its item is gone with the draft: Stripe's 404
    attention = parts.invoice().attention
    assert attention is not None and "cannot be read" in attention, attention
    assert parts.ledger.transaction(more[0]).state is TxnState.RESERVED  # owed, never dropped

    redraft(parts.ledger, parts.stripe, parts.id, "deleted in the dashboard", "ops")
    parts.pusher.push(line)
    assert parts.stripe.held(line) == [300]  # everything owed, on the new draft
    assert parts.ledger.transaction(more[0]).state is TxnState.CHARGED
    assert parts.invoice().stripe_invoice_id not in (None, lost)


def test_a_push_racing_the_redraft_loses_the_save_and_goes_to_the_new_draft() -> None:
    parts = Parts().bill()
    lost = parts.invoice().stripe_invoice_id
    assert lost is not None
    parts.stripe.delete_draft(lost)
    line = parts.lines[0]
    reserve(parts.ledger, 1, quantity=1000, prefix="late")
    parts.pusher.push(line)  # stopped: the invoice needs attention
    reserve(parts.ledger, 1, quantity=1000, prefix="later")
    parts.clock.now += POLICY.max_delay  # its retry is due
    # The operator redrafts while a pusher, which loaded the line's push before, is about
    # to record its attempt: the redraft saves first, the push's save loses the race.
    parts.ledger.before_save = [
        lambda: redraft(parts.ledger, parts.stripe, parts.id, "deleted", "ops") and None
    ]
    lost_races: list[str] = []
    save = parts.ledger.save

    def counted(*objs: Any, **kwargs: Any) -> Any:
        try:
            return save(*objs, **kwargs)
        except IntegrityError:
            lost_races.append(type(objs[0]).__name__)
            raise

    parts.ledger.save = counted  # type: ignore[method-assign]
    parts.pusher.push(line)
    assert lost_races == ["LinePush"]  # the push loaded before the redraft lost
    assert parts.invoice().draft == 2
    assert parts.stripe.held(line) == [300]  # on the new draft, once
    assert not [i for i in parts.stripe.items.values() if i["invoice"] == lost]


def test_a_draft_is_replaced_only_when_stripe_says_it_is_gone() -> None:
    parts = Parts().bill()
    with pytest.raises(RedraftRefused, match="needs no attention"):
        redraft(parts.ledger, parts.stripe, parts.id, "how", "who")
    stopped = parts.invoice()
    stopped.need_attention("an item added by hand")
    parts.ledger.save(stopped)
    with pytest.raises(RedraftRefused, match="still holds draft"):
        redraft(parts.ledger, parts.stripe, parts.id, "how", "who")
    parts.stripe.failures.append(ChargeFailure("http_503", "down", retryable=True))
    with pytest.raises(RedraftRefused, match=r"could not be asked .* try again"):
        redraft(parts.ledger, parts.stripe, parts.id, "how", "who")
    parts.stripe.failures.append(ChargeFailure("http_403", "no access", retryable=False))
    with pytest.raises(RedraftRefused, match="did not say it is gone"):
        redraft(parts.ledger, parts.stripe, parts.id, "how", "who")
    assert parts.invoice().draft == 1 and parts.invoice().attention == "an item added by hand"


def test_an_invoice_finalized_in_stripe_is_never_redrafted() -> None:
    parts = Parts().bill().final()
    stopped = parts.invoice()
    stopped.need_attention("looked wrong")  # final in the ledger: replace_draft refuses
    parts.ledger.save(stopped)
    with pytest.raises(RedraftRefused, match="finalized: cannot replace its draft"):
        redraft(parts.ledger, parts.stripe, parts.id, "how", "who")
    parts2 = Parts().bill().closed()
    stripe_id = parts2.invoice().stripe_invoice_id
    assert stripe_id is not None
    parts2.stripe.finalize_invoice(stripe_id, parts2.id, look_first=False)  # by hand
    stopped2 = parts2.invoice()
    stopped2.need_attention("finalized by hand")
    parts2.ledger.save(stopped2)
    with pytest.raises(RedraftRefused, match="is open, not deleted"):
        redraft(parts2.ledger, parts2.stripe, parts2.id, "how", "who")


def test_invoices_close_counts_an_invoice_whose_read_back_was_refused_unsent_as_not_finalized(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    import projections.invoices as projected
    from adapters import bootstrap
    from adapters.cli import ledger as cli

    parts = Parts().bill()  # open, before its deadline: closed early by the operator
    closer = InvoiceCloser(
        parts.ledger,
        parts.stripe,
        lambda line, _c: parts.pusher.push(line),
        POLICY,
        GRACE,
        clock=parts.clock,
        jitter=lambda: 0.5,
        landing=LANDING,
    )  # fmt: skip  (bootstrap.build_closer without a scheduler: lines pushed at once)

    class _Db:
        @contextlib.contextmanager
        def connection(self) -> Iterator[None]:
            yield None

    @contextlib.contextmanager
    def database(*_a: Any, **_k: Any) -> Iterator[_Db]:
        yield _Db()

    @contextlib.contextmanager
    def open_ledger(*_a: Any, **_k: Any) -> Iterator[Any]:
        yield parts.ledger

    monkeypatch.setattr(bootstrap, "database", database)
    monkeypatch.setattr(bootstrap, "open_ledger", open_ledger)
    monkeypatch.setattr(bootstrap, "build_pusher", lambda *_a, **_k: parts.pusher)
    monkeypatch.setattr(bootstrap, "build_closer", lambda *_a, **_k: closer)
    monkeypatch.setattr(projected, "invoices", lambda *_a, **_k: [{"invoice_id": parts.id}])
    monkeypatch.setattr(projected, "unprojected_invoices", lambda *_a, **_k: [])

    parts.stripe.failures.append(
        ChargeFailure("circuit_open", "Stripe circuit breaker is open", True, sent=False)
    )
    args = argparse.Namespace(
        close_customer=None, close_period=parts.invoice().period_start, reason="churned"
    )
    code = cli._close_invoices(args)
    out = capsys.readouterr().out
    assert parts.invoice().state is FIN  # not finalized: its read back never went
    assert "not finalized yet" in out, out
    assert code != 0
