"""The pusher making a draft's new lines together, over HTTP: the real ``StripeGateway``
(the SDK) against the Stripe emulator, the ledger in memory. One ``add_lines`` request
makes every new line's item with its line and chunk in the metadata; the line items
Stripe named come with the answer, so the next change is one ``update_lines`` with no
list of the draft's lines before it; a request Stripe executes after the client gave up
is retried under its key and makes nothing twice; a refusal on a draft makes each line
on its own, none compensated."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from uuid import UUID

import pytest

from adapters.charging.pusher import LinePusher
from adapters.settings import StripeSettings
from adapters.stripe.client import StripeGateway
from domain.saga import RetryPolicy, StepResult
from domain.transaction import TxnState
from infra.stripe_emulator import StripeEmulator, invoice_items
from tests.fast.fakes import T0, Clock, memory_ledger, reserve
from tests.integration.emulator.support import wait_until

pytestmark = pytest.mark.integration

METERS = ("api.requests", "gpt-4o.input_tokens", "gpt-4o.output_tokens")
ADD = "POST /v1/invoices/{id}/add_lines"


class Pushed:
    """Three new lines of one customer, a pusher and the emulator it talks to."""

    def __init__(self, emulator: StripeEmulator) -> None:
        self.emulator = emulator
        self.clock = Clock(T0)
        self.ledger = memory_ledger()
        self.gateway = StripeGateway(StripeSettings(api_base=emulator.url, timeout_s=5.0))
        self.pusher = LinePusher(
            self.ledger, self.gateway, RetryPolicy(horizon=timedelta(hours=1)),
            clock=self.clock, jitter=lambda: 0.5,
        )  # fmt: skip
        self.txns: list[UUID] = []
        self.lines = [self.line(self.more(meter, "a")) for meter in METERS]

    def more(self, meter: str, prefix: str) -> UUID:
        [txn] = reserve(self.ledger, 1, quantity=100_000, meter=meter, prefix=f"{prefix}-{meter}")
        self.txns.append(txn)
        return txn

    def line(self, txn: UUID) -> UUID:
        line = self.ledger.transaction(txn).line_id
        assert line is not None
        return line

    def posts(self) -> list[str]:
        """The API's POST paths so far, ids replaced by ``{id}``."""
        out = []
        for r in self.emulator.requests():
            if r["method"] == "POST":
                parts = r["path"].split("/")
                out.append("/".join("{id}" if p[:3] in ("in_", "ii_") else p for p in parts))
        return out

    def items(self) -> list[dict[str, object]]:
        return self.emulator.invoice_items()

    def stripe_equals_billed(self) -> bool:
        held: dict[str, int] = {}
        for item in self.items():
            meta = item["metadata"]
            assert isinstance(meta, dict)
            held[meta["line_id"]] = held.get(meta["line_id"], 0) + int(str(item["amount"]))
        return held == {str(line): self.ledger.line_by_id(line).billed for line in self.lines}

    def charged(self) -> bool:
        return {self.ledger.transaction(t).state for t in self.txns} == {TxnState.CHARGED}


@pytest.fixture
def pushed() -> Iterator[Pushed]:
    with StripeEmulator(port=0, seed=1) as emulator:
        yield Pushed(emulator)


def test_a_drafts_new_lines_are_made_by_one_request_and_later_set_by_one(pushed: Pushed) -> None:
    first, *others = pushed.lines
    report = pushed.pusher.push(first)
    assert report.result is StepResult.CHARGED and set(report.lines) == set(others)
    assert pushed.posts() == ["/v1/customers", "/v1/invoices", "/v1/invoices/{id}/add_lines"]
    made = {(i["metadata"]["line_id"], i["metadata"]["chunk"]) for i in pushed.items()}  # type: ignore[index]
    assert made == {(str(line), "0") for line in pushed.lines}
    for line in pushed.lines:
        push = pushed.ledger.line_push(line)
        assert push is not None and push.line_item_ids() is not None
        assert push.pushed_sequence == pushed.ledger.line_by_id(line).sequence
    assert pushed.charged() and pushed.stripe_equals_billed()
    for meter in METERS:
        pushed.more(meter, "b")
    before = len(pushed.emulator.requests())
    assert pushed.pusher.push(others[0]).result is StepResult.CHARGED
    after = pushed.emulator.requests()[before:]
    assert [(r["method"], r["path"].rsplit("/", 1)[-1]) for r in after] == [
        ("POST", "update_lines")
    ]
    assert pushed.charged() and pushed.stripe_equals_billed()


def test_new_lines_executed_after_the_client_gave_up_are_made_once(pushed: Pushed) -> None:
    pushed.emulator.set_faults(late_execute_next=1, late_execute_s=0.3)
    report = pushed.pusher.push(pushed.lines[0])
    assert report.result is StepResult.RETRY
    for line in pushed.lines:  # each attempt recorded before the call, still in doubt
        push = pushed.ledger.line_push(line)
        assert push is not None and push.in_doubt_until(T0) is not None
    wait_until(lambda: len(pushed.items()) == 3, what="the late add_lines")
    pushed.clock.now = report.retry_at or T0
    assert pushed.pusher.push(pushed.lines[2]).result is StepResult.CHARGED
    outcomes = [r["outcome"] for r in pushed.emulator.requests() if r["path"].endswith("add_lines")]
    assert outcomes == ["executed_late", "replayed"]  # the same set under the same key
    assert len(pushed.items()) == 3 and pushed.charged() and pushed.stripe_equals_billed()


def test_new_lines_refused_on_a_draft_are_made_one_by_one_none_compensated(
    pushed: Pushed, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Stripe refuses the batch (a bound lower than this request, say): it is a draft still.
    monkeypatch.setattr(invoice_items, "MAX_LINES_PER_UPDATE", 2)
    report = pushed.pusher.push(pushed.lines[0])
    monkeypatch.undo()
    assert report.result is StepResult.CHARGED
    for line in pushed.lines[1:]:
        assert pushed.pusher.push(line).result is StepResult.CHARGED
    assert pushed.posts()[2:] == [
        "/v1/invoices/{id}/add_lines", *["/v1/invoiceitems"] * 3,
    ]  # fmt: skip
    assert pushed.charged() and pushed.stripe_equals_billed()
