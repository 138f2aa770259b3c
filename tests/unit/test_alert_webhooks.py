"""The alert webhooks' pure parts: signatures a receiver can verify, the URLs refused
(server-side request forgery), and the alert document the relay publishes."""

from __future__ import annotations

import json
from collections.abc import Sequence
from decimal import Decimal
from uuid import UUID

import pytest
from eventsourcing.application import Application

from adapters.alerts.endpoints import UnsafeUrl, resolve_target
from adapters.alerts.messages import ALERT_CROSSED, alert_document
from adapters.alerts.worker import decode_alert
from billing_ledger_webhooks import SignatureError, signature_header, verify
from domain.account import CustomerAccount
from domain.alerts import Spend
from domain.ids import transaction_id
from store.recorder import OrjsonTranscoder

SECRET = "whsec_test"
BODY = b'{"id":"5f0c7d36-4d8e-5b8a-9a57-2f0b5e3c9d41","type":"alert.crossed"}'
NOW = 1_780_000_000


def test_a_signed_body_verifies_and_yields_the_event() -> None:
    header = signature_header(BODY, SECRET, NOW)
    assert verify(BODY, header, SECRET, now=NOW + 10)["type"] == "alert.crossed"


@pytest.mark.parametrize(
    ("body", "secret", "now", "reason"),
    [
        (BODY.replace(b"alert", b"alarm"), SECRET, NOW, "no signature matches"),
        (BODY, "whsec_other", NOW, "no signature matches"),
        (BODY, SECRET, NOW + 301, "more than 300 s"),
        (BODY, SECRET, NOW - 301, "more than 300 s"),
    ],
)
def test_an_altered_body_another_secret_or_an_old_request_is_refused(
    body: bytes, secret: str, now: int, reason: str
) -> None:
    header = signature_header(BODY, SECRET, NOW)
    with pytest.raises(SignatureError, match=reason):
        verify(body, header, secret, now=now)


@pytest.mark.parametrize("header", ["", "t=1", "v1=abc", "t=x,v1=abc", "garbage"])
def test_a_malformed_header_is_refused(header: str) -> None:
    with pytest.raises(SignatureError, match="malformed"):
        verify(BODY, header, SECRET, now=NOW)


def test_any_of_several_signatures_may_match_during_a_rotation() -> None:
    good = signature_header(BODY, SECRET, NOW).split(",")[1]
    assert verify(BODY, f"t={NOW},v1={'0' * 64},{good}", SECRET, now=NOW)


def _resolver(*addresses: str) -> object:
    def resolve(host: str, port: int) -> Sequence[str]:
        return addresses

    return resolve


@pytest.mark.parametrize(
    ("url", "addresses", "reason"),
    [
        ("ftp://hooks.example.com/x", ("203.0.113.9",), "only http and https"),
        ("file:///etc/passwd", ("203.0.113.9",), "only http and https"),
        ("http:///nohost", ("203.0.113.9",), "no host"),
        ("http://user:pw@hooks.example.com/", ("93.184.216.34",), "credentials"),
        ("http://metadata.example.com/", ("169.254.169.254",), "link-local"),
        ("http://hooks.example.com/", ("127.0.0.1",), "loopback"),
        ("http://hooks.example.com/", ("::1",), "loopback"),
        ("http://hooks.example.com/", ("10.1.2.3",), "private"),
        ("http://hooks.example.com/", ("192.168.1.1",), "private"),
        ("http://hooks.example.com/", ("172.16.0.5",), "private"),
        ("http://hooks.example.com/", ("::ffff:127.0.0.1",), "loopback"),
        ("http://hooks.example.com/", ("fe80::1",), "link-local"),
        ("http://hooks.example.com/", ("0.0.0.0",), "unspecified"),  # noqa: S104
        ("http://hooks.example.com/", ("93.184.216.34", "10.0.0.1"), "private"),  # any one
        ("http://hooks.example.com/", (), "does not resolve"),
        ("http://hooks.example.com:99999/", ("93.184.216.34",), "not a URL"),
    ],
)
def test_urls_that_reach_inside_are_refused(
    url: str, addresses: tuple[str, ...], reason: str
) -> None:
    with pytest.raises(UnsafeUrl, match=reason):
        resolve_target(url, allow_private=False, resolve=_resolver(*addresses))  # type: ignore[arg-type]


def test_a_public_url_targets_the_address_that_was_checked() -> None:
    target = resolve_target(
        "https://hooks.example.com/billing?x=1",
        allow_private=False,
        resolve=_resolver("93.184.216.34"),  # type: ignore[arg-type]
    )
    assert (target.scheme, target.host, target.port, target.path, target.address) == (
        "https",
        "hooks.example.com",
        443,
        "/billing?x=1",
        "93.184.216.34",
    )


def test_the_private_setting_allows_loopback_but_still_checks_the_scheme() -> None:
    target = resolve_target(
        "http://127.0.0.1:8080/",
        allow_private=True,
        resolve=_resolver("127.0.0.1"),  # type: ignore[arg-type]
    )
    assert (target.address, target.port) == ("127.0.0.1", 8080)
    with pytest.raises(UnsafeUrl, match="only http"):
        resolve_target("gopher://127.0.0.1/", allow_private=True)


def test_an_unresolvable_name_is_refused_by_the_system_resolver() -> None:
    with pytest.raises(UnsafeUrl, match="does not resolve"):
        resolve_target("http://no-such-host.invalid/", allow_private=False)


def _stored_crossing() -> dict[str, object]:
    """An AlertCrossed event as the store holds it (the transcoder's JSON)."""
    account = CustomerAccount.open("acme", "USD", 1000)
    account.set_alerts(["percent_of_limit:80"])
    account.reserve_all([(transaction_id("acme", "u1"), Decimal("800.5"))])
    spend = Spend("u1", transaction_id("acme", "u1"), Decimal("800.5"), "2026-12-01T00:00:00Z")
    account.check_alerts([spend], [True])
    (event,) = [e for e in account.collect_events() if isinstance(e, CustomerAccount.AlertCrossed)]
    state = {
        k: v for k, v in vars(event).items() if k not in ("originator_id", "originator_version")
    }
    transcoder = OrjsonTranscoder()
    Application[UUID](env={"PERSISTENCE_MODULE": "eventsourcing.popo"}).register_transcodings(
        transcoder
    )
    stored: dict[str, object] = json.loads(transcoder.encode(state))
    return stored


def test_the_alert_document_carries_the_crossing_exactly() -> None:
    alert = alert_document(_stored_crossing(), 4711)
    assert alert is not None
    document = json.loads(alert.body)
    assert document == {
        "id": alert.id,
        "type": ALERT_CROSSED,
        "created_at": document["created_at"],
        "customer_id": "acme",
        "currency": "USD",
        "threshold": {"kind": "percent_of_limit", "value": 80},
        "period": "2026-12-01T00:00:00Z",
        "usage_id": "u1",
        "transaction_id": str(transaction_id("acme", "u1")),
        "value": "800.5",
        "spend_limit": 1000,
        "grant_id": None,
        "notification_id": 4711,
    }
    assert document["created_at"].startswith("20")
    assert decode_alert(alert.body) == alert  # what the webhooks role reads back


@pytest.mark.parametrize(
    "state",
    [None, [], "x", {"alert_id": 1}, {**{"alert_id": "a"}, "threshold": "spend"}],
)
def test_a_state_that_is_no_crossing_gives_no_document(state: object) -> None:
    assert alert_document(state, 1) is None


@pytest.mark.parametrize(
    "change",
    [
        {"threshold": "spend:\u00b2"},  # a digit to str.isdigit, not to int()
        {"threshold": "spend:" + "1" * 5000},  # more digits than int() reads from text
        {"customer_id": "\ud800"},  # JSON's escape of a lone surrogate: no UTF-8 for it
    ],
    ids=["superscript-threshold", "5000-digit-threshold", "lone-surrogate"],
)
def test_a_crossing_that_reads_as_json_but_makes_no_document_gives_none_not_an_error(
    change: dict[str, str],
) -> None:
    # A hand's row or an old build's: the alerts relay would stop on it at every restart.
    state = json.loads(json.dumps({**_stored_crossing(), **change}))
    assert alert_document(state, 1) is None


@pytest.mark.parametrize(
    "value",
    [None, b"", b"not json", b"[]", b'{"id": "x", "type": "alert.crossed", "customer_id": "a"}'],
)
def test_an_unreadable_alert_record_decodes_to_none(value: bytes | None) -> None:
    assert decode_alert(value) is None
