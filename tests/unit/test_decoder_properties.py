"""Property-based tests: every decoder of outside bytes returns a value or its one
documented error with a one-line reason, for any bytes and any JSON (issue 11).

The generated inputs lean on what broke decoders before: integers past Python's
4,300-digit limit, exponents past ``Decimal``'s range, deep nesting, lone surrogates
and other odd unicode, floats written every way, ``NaN``/``Infinity`` literals, and
valid records with one field replaced by any of those.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import store.ledger  # noqa: F401 (imports every aggregate, so their events are known)
from adapters.charging.messages import EventMessage, MalformedEvent, decode_event
from adapters.stripe.views import StripeEvent, invoice_view, stripe_event
from domain.errors import InvalidUsage
from domain.usage import MAX_NESTING, UsageRecord, decode_usage

QUICK = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# Reason prefixes documented in domain.usage's docstring, and the fields it names.
USAGE_PREFIXES = (
    "empty message (no value)",
    "payload of ",
    "not valid JSON: ",
    "number too long: ",
    "number out of range: ",
    "expected a JSON object, got ",
    "unknown currency ",
    *(f"{name}: " for name in UsageRecord.model_fields),
    *(f"{name}." for name in UsageRecord.model_fields),
)

VALID: dict[str, str] = {
    "usage_id": '"req-1"',
    "customer_id": '"acme"',
    "meter": '"api.requests"',
    "quantity": "1520",
    "occurred_at": '"2026-12-02T10:15:00Z"',
    "currency": '"USD"',
}


EVENT_FIELDS = ("notification_id", "originator_id", "originator_version", "topic", "event")
EVENT_PREFIXES = (
    "empty message (no value)",
    "message of ",
    "not valid JSON: ",
    "expected a JSON object, got ",
    "unknown event ",
    *(f"{name}: " for name in EVENT_FIELDS),
)
VALID_EVENT: dict[str, str] = {
    "notification_id": "42",
    "originator_id": '"285ad872-9dad-5d87-9f2b-3fbdc040090b"',
    "originator_version": "2",
    "topic": '"domain.transaction:BillingTransaction.Reserved"',
    "event": '"Reserved"',
}


def _number_texts() -> st.SearchStrategy[str]:
    """JSON number literals, ordinary and hostile."""
    return st.one_of(
        st.integers().map(str),
        st.integers(min_value=4290, max_value=4400).map(lambda n: "9" * n),  # int limit
        st.integers(min_value=95, max_value=105).map(lambda n: "1" * n),  # our length bound
        st.integers(min_value=-(10**25), max_value=10**25).map(lambda e: f"1e{e}"),
        st.integers(min_value=10**18, max_value=10**25).map(lambda e: f"-7.1e-{e}"),
        st.integers(min_value=990, max_value=1010).map(lambda e: f"-2.5E+{e}"),
        st.floats().map(repr),  # 'nan' and 'inf' are not JSON; '1e+300' is
        st.decimals(allow_nan=False, allow_infinity=False).map(str),
        st.from_regex(
            r"-?(0|[1-9][0-9]{0,40})(\.[0-9]{1,40})?([eE][+-]?[0-9]{1,30})?", fullmatch=True
        ),
        st.sampled_from(["NaN", "Infinity", "-Infinity", "-0", "0.0e0", "1E400", "1e-400"]),
    )


def _string_texts() -> st.SearchStrategy[str]:
    """JSON string literals: any text, escaped or not, and lone surrogates."""
    return st.one_of(
        st.text().map(json.dumps),
        st.text().map(lambda s: json.dumps(s, ensure_ascii=False)),
        st.sampled_from(
            [
                '"\\ud800"',
                '"\\udfff\\ud800"',
                '"a\\u0000b"',
                '"\u202e"',
                '"\uff21\uff23\uff2d\uff25"',
            ]
        ),
    )


def _json_texts() -> st.SearchStrategy[str]:
    scalars = st.one_of(
        _number_texts(), _string_texts(), st.sampled_from(["true", "false", "null"])
    )
    values = st.recursive(
        scalars,
        lambda inner: st.one_of(
            st.lists(inner, max_size=4).map(lambda xs: "[" + ",".join(xs) + "]"),
            st.lists(st.tuples(_string_texts(), inner), max_size=4).map(
                lambda kvs: "{" + ",".join(f"{k}:{v}" for k, v in kvs) + "}"
            ),
        ),
        max_leaves=12,
    )
    deep = st.integers(min_value=1, max_value=20_000).map(lambda n: "[" * n + "]" * n)
    unbalanced = st.integers(min_value=1, max_value=20_000).map(lambda n: '{"a":' * n)
    return st.one_of(values, deep, unbalanced)


def _with_one_field_replaced(valid: dict[str, str]) -> st.SearchStrategy[str]:
    """A valid object whose one field (or an extra one) holds any JSON value."""
    fields = st.sampled_from([*valid, "extra"])
    return st.tuples(fields, _json_texts()).map(
        lambda fv: "{" + ",".join(f'"{k}":{v}' for k, v in {**valid, fv[0]: fv[1]}.items()) + "}"
    )


def _check_usage(raw: bytes | None) -> None:
    try:
        record = decode_usage(raw)
    except InvalidUsage as exc:
        _check_reason(str(exc), USAGE_PREFIXES)
    else:
        assert isinstance(record, UsageRecord)


def _check_reason(reason: str, prefixes: tuple[str, ...]) -> None:
    """Non-empty, one line, storable (UTF-8, no NUL), and one of the documented kinds."""
    assert reason and reason.strip() == reason
    assert "\n" not in reason and "\r" not in reason and "\x00" not in reason
    reason.encode("utf-8")  # a header and a text column: a lone surrogate would fail here
    assert reason.startswith(prefixes), reason


@QUICK
@given(st.binary(max_size=512))
def test_decode_usage_of_any_bytes_is_a_record_or_a_documented_reason(raw: bytes) -> None:
    _check_usage(raw)


@QUICK
@given(_json_texts())
@example("9" * 4301)  # ValueError from int() before issue 11
@example('{"x": 1e99999999999999999999}')  # decimal.InvalidOperation before issue 11
@example("[" * 100_000)
def test_decode_usage_of_any_json_is_a_record_or_a_documented_reason(text: str) -> None:
    _check_usage(text.encode("utf-8", "surrogatepass"))


@QUICK
@given(_with_one_field_replaced(VALID))
def test_decode_usage_of_a_record_with_any_field_value_is_a_record_or_a_reason(text: str) -> None:
    _check_usage(text.encode("utf-8", "surrogatepass"))


@QUICK
@given(st.sampled_from(["utf-16", "utf-32", "utf-8-sig", "latin-1"]), _json_texts())
def test_decode_usage_of_json_in_other_encodings_is_a_record_or_a_reason(
    encoding: str, text: str
) -> None:
    _check_usage(text.encode(encoding, "replace"))


def _check_event(raw: bytes | None) -> None:
    try:
        message = decode_event(raw)
    except MalformedEvent as exc:
        _check_reason(str(exc), EVENT_PREFIXES)
    else:
        assert isinstance(message, EventMessage)
        assert decode_event(message.to_json()) == message


@QUICK
@given(st.one_of(st.none(), st.binary(max_size=512)))
def test_decode_event_of_any_bytes_is_a_message_or_a_documented_reason(raw: bytes | None) -> None:
    _check_event(raw)


@QUICK
@given(_json_texts())
@example("[]")
@example('{"originator_id": "not-a-uuid"}')
def test_decode_event_of_any_json_is_a_message_or_a_documented_reason(text: str) -> None:
    _check_event(text.encode("utf-8", "surrogatepass"))


@QUICK
@given(_with_one_field_replaced(VALID_EVENT))
def test_decode_event_of_a_message_with_any_field_value_is_a_message_or_a_reason(
    text: str,
) -> None:
    _check_event(text.encode("utf-8", "surrogatepass"))


def test_the_valid_event_the_properties_start_from_is_read() -> None:
    text = "{" + ",".join(f'"{k}":{v}' for k, v in VALID_EVENT.items()) + "}"
    assert decode_event(text.encode()).event == "Reserved"


# -- Stripe's webhooks: the envelope and the invoice object ------------------------------

VALID_WEBHOOK = {
    "id": '"evt_1"',
    "type": '"invoice.paid"',
    "created": "1764547200",
    "data": '{"object": {"id": "in_1", "status": "paid", "total": 250, "amount_paid": 250,'
    ' "attempt_count": 1, "number": "A-0001", "metadata": {"invoice_id":'
    ' "0b1c2d3e-0000-5000-8000-000000000001"}}}',
}


def _check_webhook(raw: bytes) -> None:
    try:
        event = stripe_event(raw)
    except ValueError as exc:
        assert str(exc) and "\n" not in str(exc)
        return
    assert isinstance(event, StripeEvent) and 0 < len(event.id) <= 255
    try:
        view = invoice_view(event.obj, event.id)
    except ValueError as exc:
        assert str(exc)
        return
    assert view.total >= 0 and view.amount_paid >= 0 and view.source == event.id
    event.metadata_uuid("invoice_id")  # a UUID or None, never an exception


@QUICK
@given(st.binary(max_size=512))
def test_a_webhook_body_of_any_bytes_is_an_event_or_a_reason(raw: bytes) -> None:
    _check_webhook(raw)


@QUICK
@given(_json_texts())
def test_a_webhook_body_of_any_json_is_an_event_or_a_reason(text: str) -> None:
    _check_webhook(text.encode("utf-8", "surrogatepass"))


@QUICK
@given(_with_one_field_replaced(VALID_WEBHOOK))
def test_a_webhook_with_any_field_value_is_an_event_or_a_reason(text: str) -> None:
    _check_webhook(text.encode("utf-8", "surrogatepass"))


@QUICK
@given(_json_texts())
def test_an_invoice_object_with_any_status_transitions_is_a_view_or_a_reason(text: str) -> None:
    body = (
        '{"id": "evt_2", "type": "invoice.paid", "data": {"object": {"status": "paid",'
        ' "status_transitions": ' + text + "}}}"
    )
    _check_webhook(body.encode("utf-8", "surrogatepass"))


def test_the_valid_webhook_the_properties_start_from_is_read() -> None:
    body = ("{" + ", ".join(f'"{k}": {v}' for k, v in VALID_WEBHOOK.items()) + "}").encode()
    event = stripe_event(body)
    view = invoice_view(event.obj, event.id)
    assert (event.id, event.type, view.status, view.total, view.number) == (
        "evt_1", "invoice.paid", "paid", 250, "A-0001",
    )  # fmt: skip
    assert str(event.metadata_uuid("invoice_id")) == "0b1c2d3e-0000-5000-8000-000000000001"


def _at_depth(frames: int, call: Any) -> Any:
    """``call()`` with ``frames`` more Python frames beneath it."""
    return call() if frames == 0 else _at_depth(frames - 1, call)


def _reason(raw: bytes) -> str:
    try:
        return f"record {decode_usage(raw).usage_id}"
    except InvalidUsage as exc:
        return str(exc)


@pytest.mark.parametrize("levels", [MAX_NESTING - 1, MAX_NESTING, MAX_NESTING + 1, 1985])
def test_nesting_gets_the_same_verdict_however_deep_the_callers_stack(levels: int) -> None:
    """Nested data in a field nobody reads: within ``MAX_NESTING`` the record is read,
    past it refused, and neither depends on the caller's stack (json's own
    ``RecursionError`` did: a 1,985-level object was 'nested too deeply' near the top of
    the stack and 'Expecting value' a few frames up the raised limit)."""
    nested = "[" * (levels - 1) + "]" * (levels - 1)  # inside the record: one level more
    raw = (
        '{"usage_id":"r","customer_id":"a","meter":"m","quantity":1,'
        f'"occurred_at":"2026-12-02T10:15:00Z","extra":{nested},"also":"[[[["'
        "}"
    ).encode()
    expected = "record r" if levels <= MAX_NESTING else "not valid JSON: nested too deeply"
    assert _reason(raw) == expected
    assert _at_depth(400, lambda: _reason(raw)) == expected
    unbalanced = ('{"a":' * levels).encode()
    verdicts = {_reason(unbalanced), _at_depth(400, lambda: _reason(unbalanced))}
    assert len(verdicts) == 1


def _record_with(extra: str) -> bytes:
    return (
        '{"usage_id":"r","customer_id":"a","meter":"m","quantity":1,'
        f'"occurred_at":"2026-12-02T10:15:00Z","extra":{extra}}}'
    ).encode()


@pytest.mark.parametrize(
    ("extra", "depth"),
    [
        ('{"a":' * (MAX_NESTING - 1) + "1" + "}" * (MAX_NESTING - 1), MAX_NESTING),
        ('{"a":' * MAX_NESTING + "1" + "}" * MAX_NESTING, MAX_NESTING + 1),
        # deepest only after a bracket closed: every closer takes exactly one level off
        ("[" * (MAX_NESTING - 3) + "[],[[]]" + "]" * (MAX_NESTING - 3), MAX_NESTING),
        ("[" * (MAX_NESTING - 2) + "[],[[]]" + "]" * (MAX_NESTING - 2), MAX_NESTING + 1),
    ],
)
def test_nesting_counts_objects_and_arrays_level_by_level(extra: str, depth: int) -> None:
    """``depth`` counts the record's own object too."""
    expected = "record r" if depth <= MAX_NESTING else "not valid JSON: nested too deeply"
    assert _reason(_record_with(extra)) == expected


def test_a_parser_out_of_stack_within_the_nesting_bound_gives_the_same_reason() -> None:
    """Within ``MAX_NESTING`` a caller already deep in its stack can still run the parser
    out of recursion: that record gets the same reason, not an exception."""
    extra = "[" * (MAX_NESTING - 1) + "]" * (MAX_NESTING - 1)
    frames = sys.getrecursionlimit() - MAX_NESTING // 2
    assert _at_depth(frames, lambda: _reason(_record_with(extra))) == (
        "not valid JSON: nested too deeply"
    )
