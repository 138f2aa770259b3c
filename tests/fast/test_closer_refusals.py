"""The closer's answers to refusals: a repair our own limiter refused unsent is no
repair (it does not count toward ``MAX_REPAIRS``); ``invoices close`` counts an invoice
whose read back our own breaker refused as not finalized; and, pinned as a known gap, a
draft deleted by hand in Stripe that settling cannot bring back.

Built on the ``Parts`` harness and the strict fake Stripe of ``test_closer_pinned``.
"""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import Iterator
from typing import Any

import pytest

from adapters.charging.closer import MAX_REPAIRS, CloseResult, InvoiceCloser
from domain.invoice_states import InvoiceState
from domain.saga import ChargeFailure
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


@pytest.mark.xfail(
    strict=True,
    reason="known gap (runbook invoice-attention.md): the ledger keeps the deleted draft's"
    " id, so every settle reads it again, is refused again, and stops again; no command"
    " makes the invoice a new draft yet",
)
def test_a_draft_deleted_by_hand_is_finalized_once_the_attention_is_settled() -> None:
    parts = Parts().bill().closed()
    stripe_id = parts.invoice().stripe_invoice_id
    assert stripe_id is not None
    del parts.stripe.drafts[stripe_id]  # deleted in the dashboard
    assert parts.step().result is S.ATTENTION
    assert parts.invoice().attention is not None
    assert parts.invoice().attention.startswith("Stripe refused the read back")  # type: ignore[union-attr]
    stopped = parts.invoice()
    stopped.settle_attention("looked at the dashboard", "ops@example.com")
    parts.ledger.save(stopped)
    step = parts.step()
    assert step.result is not S.ATTENTION, parts.invoice().attention
    assert parts.invoice().state is InvoiceState.FINALIZED


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
