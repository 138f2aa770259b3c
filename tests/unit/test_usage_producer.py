"""``UsageProducer``, the client a service sends its usage with: each record checked by
the ingest's rules (and the price list, when given) before it is sent, keyed by its
customer; nothing sent for a record the ledger would set aside."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from kafka.errors import KafkaTimeoutError
from kafka.future import Future

from adapters import broker
from adapters.broker import PublishFailed
from adapters.cli.main import main
from adapters.ingest.producer import UsageProducer, check_record
from adapters.settings import Settings
from domain.errors import InvalidUsage, UnknownMeter
from domain.price_book import PriceBook
from domain.pricing import Price, PriceList
from domain.usage import UsageRecord, decode_usage

AT = datetime(2026, 12, 4, 10, tzinfo=UTC)


class _Kafka:
    """What a KafkaProducer was asked to do; the broker answers each send at the next
    flush (``refusing``: with that error)."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, bytes | None, bytes]] = []
        self.flushed = self.closed = 0
        self.refusing: str | None = None
        self._waiting: list[Future] = []

    def send(self, topic: str, key: bytes | None, value: bytes, headers: Any = None) -> Future:
        self.sent.append((topic, key, value))
        self._waiting.append(Future())
        return self._waiting[-1]

    def flush(self) -> None:
        self.flushed += 1
        for future in self._waiting:
            if self.refusing is None:
                future.success(None)
            else:
                future.failure(KafkaTimeoutError(self.refusing))
        self._waiting = []

    def close(self) -> None:
        self.closed += 1


def _producer(**kw: Any) -> tuple[UsageProducer, _Kafka]:
    kafka = _Kafka()
    return UsageProducer(kafka, "usage", **kw), kafka


def test_a_record_made_of_fields_is_checked_keyed_by_its_customer_and_sent() -> None:
    usage, kafka = _producer(prices=Settings().load_prices())
    sent = usage.send(
        customer_id="acme", usage_id="req-42", meter="gpt-4o.input_tokens", quantity=1200,
        occurred_at=AT,
    )  # fmt: skip
    [(topic, key, value)] = kafka.sent
    assert (topic, key) == ("usage", b"acme")
    assert decode_usage(value) == sent
    assert (sent.usage_id, sent.quantity, sent.occurred_at) == ("req-42", Decimal(1200), AT)
    assert usage.sent == 1


def test_a_record_without_a_time_is_stamped_now() -> None:
    usage, _ = _producer()
    before = datetime.now(UTC)
    sent = usage.send(customer_id="acme", usage_id="u", meter="api.requests", quantity="0.5")
    assert before <= sent.occurred_at <= datetime.now(UTC)


@pytest.mark.parametrize(
    ("fields", "reason"),
    [
        ({"quantity": -100}, "quantity"),
        ({"quantity": None}, "quantity"),
        ({"customer_id": "has:colon"}, "customer_id"),
        ({"usage_id": ""}, "usage_id"),
    ],
)
def test_a_record_the_ledger_would_set_aside_is_refused_and_nothing_is_sent(
    fields: dict[str, Any], reason: str
) -> None:
    usage, kafka = _producer()
    body = {"customer_id": "acme", "usage_id": "u1", "meter": "api.requests", "quantity": 3}
    with pytest.raises(InvalidUsage, match=reason):
        usage.send(**{**body, **fields})
    assert kafka.sent == [] and usage.sent == 0


def test_an_unpriced_meter_is_refused_only_when_the_prices_are_given() -> None:
    record = UsageRecord(
        usage_id="u", customer_id="acme", meter="vision.images", quantity=Decimal(1),
        occurred_at=AT,
    )  # fmt: skip
    priced, kafka = _producer(prices=Settings().load_prices())
    with pytest.raises(UnknownMeter):
        priced.send(record)
    assert kafka.sent == []
    unpriced, kafka = _producer()
    assert unpriced.send(record) == record and len(kafka.sent) == 1


def test_the_local_check_refuses_what_the_ingest_would_by_the_version_in_force() -> None:
    """A meter whose currency changed in a later version: a record that names the old
    currency after the change is the dead letter the ingest would make of it."""
    book = PriceBook.start(PriceList({"api.requests": Price(Decimal("0.001"), "USD")}))
    book.publish(PriceList({"api.requests": Price(Decimal("0.001"), "EUR")}), AT)
    schedule = book.schedule

    def value(occurred_at: datetime) -> bytes:
        return UsageRecord(
            usage_id="u", customer_id="acme", meter="api.requests", quantity=Decimal(1),
            occurred_at=occurred_at, currency="USD",
        ).to_json()  # fmt: skip

    assert check_record(value(AT - timedelta(microseconds=1)), schedule).currency == "USD"
    with pytest.raises(
        InvalidUsage, match=r"^currency 'USD' does not match meter 'api\.requests' priced in EUR$"
    ):
        check_record(value(AT), schedule)


def test_a_record_over_the_size_limit_is_refused() -> None:
    usage, kafka = _producer(max_record_bytes=256)
    with pytest.raises(InvalidUsage, match="exceeds the 256-byte limit"):
        usage.send(customer_id="acme", usage_id="u" * 150, meter="m" * 150, quantity=1)
    assert kafka.sent == []


def test_raw_bytes_are_sent_as_they_are_and_closing_flushes() -> None:
    with _producer()[0] as usage:
        kafka: _Kafka = usage.producer
        usage.send_raw(b"k", b"not json")
    assert kafka.sent == [("usage", b"k", b"not json")]
    assert (kafka.flushed, kafka.closed) == (1, 1)


def test_unchecked_the_records_are_sent_as_made_keyed_by_their_customer() -> None:
    usage, kafka = _producer(check=False, prices=Settings().load_prices())
    record = UsageRecord(
        usage_id="u", customer_id="acme", meter="vision.images", quantity=Decimal(1),
        occurred_at=AT,
    )  # fmt: skip
    assert usage.send(record) == record  # an unpriced meter: not looked at
    assert kafka.sent == [("usage", b"acme", record.to_json())]


def test_records_the_broker_did_not_acknowledge_fail_the_flush_that_waited_for_them() -> None:
    usage, kafka = _producer()
    usage.send(customer_id="acme", usage_id="a", meter="m", quantity=1, occurred_at=AT)
    usage.flush()  # acknowledged: nothing to say
    kafka.refusing = "Batch for usage-0 containing 2 record(s) expired"
    usage.send(customer_id="acme", usage_id="b", meter="m", quantity=1, occurred_at=AT)
    usage.send_raw(b"acme", b"{}")
    with pytest.raises(PublishFailed) as refused:
        usage.flush()
    assert str(refused.value) == (
        "the broker did not acknowledge 2 usage records (Batch for usage-0 containing 2"
        " record(s) expired): they were not delivered"
    )
    kafka.refusing = None
    usage.send(customer_id="acme", usage_id="b", meter="m", quantity=1, occurred_at=AT)
    usage.flush()  # sent again and acknowledged: the refusal was said once
    assert usage.refusals.count == 2 and usage.sent == 4


def test_leaving_the_with_block_says_what_was_not_acknowledged_and_still_closes() -> None:
    kafka = _Kafka()
    kafka.refusing = "expired"
    with (
        pytest.raises(PublishFailed, match="did not acknowledge 1 usage records"),
        UsageProducer(kafka, "usage") as usage,  # type: ignore[arg-type]
    ):
        usage.send(customer_id="acme", usage_id="a", meter="m", quantity=1, occurred_at=AT)
    assert kafka.closed == 1


def test_the_produce_command_says_what_the_broker_did_not_acknowledge_and_exits_1(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    kafka = _Kafka()
    kafka.refusing = "Batch for usage-2 containing 1 record(s) expired"
    monkeypatch.setattr(broker, "check_reachable", lambda bootstrap: None)
    monkeypatch.setattr(broker, "ensure_topics", lambda bootstrap, topics: None)
    monkeypatch.setattr(broker, "make_producer", lambda bootstrap: kafka)
    records = tmp_path / "usage.jsonl"
    records.write_bytes(b'{"customer_id": "acme"}\n{"customer_id": "zed"}\n')
    assert main(["produce", str(records)]) == 1
    err = capsys.readouterr().err
    assert "sent 2 record(s)" in err
    assert (
        "the broker did not acknowledge 2 of the records sent (Batch for usage-2 containing 1"
        " record(s) expired): they were not delivered: send the file again" in err
    )
    assert kafka.closed == 1
