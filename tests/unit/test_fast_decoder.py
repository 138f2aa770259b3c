"""``adapters.ingest.decoding.decode_usage_fast`` gives ``domain.usage.decode_usage``'s
verdict on any input: the same record, or the same reason, word for word (issue 14).

The inputs are the decoder property tests' (any bytes, any JSON, a valid record with
one field replaced by any JSON value, other encodings) plus flat records whose every
field is any scalar, the very inputs the fast path takes itself.
"""

from __future__ import annotations

import json
from decimal import Decimal

import orjson
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from adapters.ingest.decoding import _spaced, decode_usage_fast
from domain.errors import InvalidUsage
from domain.usage import UsageRecord, decode_usage
from tests.unit.test_decoder_properties import (
    QUICK,
    VALID,
    _json_texts,
    _number_texts,
    _string_texts,
    _with_one_field_replaced,
)


def _verdict(decode: object, raw: bytes | None, max_bytes: int) -> UsageRecord | str:
    assert callable(decode)
    try:
        record = decode(raw, max_bytes=max_bytes)
    except InvalidUsage as exc:
        return f"InvalidUsage: {exc}"
    assert isinstance(record, UsageRecord)
    return record


def _reference(raw: bytes | None, *, max_bytes: int) -> UsageRecord:
    """``decode_usage`` one frame down, as the fast decoder calls it: whether JSON
    nested about as deep as the recursion limit is "nested too deeply" depends on how
    deep the stack already is, for the reference itself."""
    return decode_usage(raw, max_bytes=max_bytes)


def _same(raw: bytes | None, max_bytes: int = 16 * 1024) -> None:
    reference = _verdict(_reference, raw, max_bytes)
    fast = _verdict(decode_usage_fast, raw, max_bytes)
    assert fast == reference
    if isinstance(reference, UsageRecord):  # Decimal('1') == Decimal('1.0'): compare text
        assert isinstance(fast, UsageRecord)
        assert str(fast.quantity) == str(reference.quantity)
        assert fast.model_dump_json() == reference.model_dump_json()


def _scalar_texts() -> st.SearchStrategy[str]:
    return st.one_of(_number_texts(), _string_texts(), st.sampled_from(["true", "false", "null"]))


def _flat_records() -> st.SearchStrategy[str]:
    """Objects of the record's fields (and an extra, and a repeated key), each any
    scalar or its valid value, with any whitespace around the tokens."""
    names = st.sampled_from([*VALID, "extra", "quantity"])
    value = st.one_of(_scalar_texts(), st.sampled_from(list(VALID.values())))
    space = st.sampled_from(["", " ", "\n", "\t", "\r\n  "])
    pair = st.tuples(names, value, space).map(lambda p: f'{p[2]}"{p[0]}"{p[2]}:{p[2]}{p[1]}')
    return st.tuples(
        st.dictionaries(st.sampled_from(list(VALID)), value, max_size=6), st.lists(pair)
    ).map(
        lambda t: (
            "{" + ",".join([*(f'"{k}":{v}' for k, v in {**VALID, **t[0]}.items()), *t[1]]) + "}"
        )
    )


@QUICK
@given(st.one_of(st.none(), st.binary(max_size=512)))
def test_any_bytes_get_the_same_verdict(raw: bytes | None) -> None:
    _same(raw)


@QUICK
@given(_json_texts())
@example("9" * 4301)
@example('{"x": 1e99999999999999999999}')
@example("[" * 100_000)
@example("[]")
@example('{"a":' + "[" * 900 + "]" * 900 + "}")  # deeper than json recurses, not orjson
@example('{"a":' * 1985)  # once 'nested too deeply' one way and 'Expecting value' the other
def test_any_json_gets_the_same_verdict(text: str) -> None:
    _same(text.encode("utf-8", "surrogatepass"))


@QUICK
@given(_with_one_field_replaced(VALID))
def test_a_record_with_any_field_value_gets_the_same_verdict(text: str) -> None:
    _same(text.encode("utf-8", "surrogatepass"))


@QUICK
@given(_flat_records())
@example('{"usage_id":"r","customer_id":"a","meter":"m","quantity":12345678901234567890.123456789,'
         '"occurred_at":"2026-12-02T10:15:00Z"}')  # fmt: skip
@example('{"usage_id":"r","customer_id":"a","meter":"m","quantity":18446744073709551616,'
         '"occurred_at":"2026-12-02T10:15:00Z"}')  # fmt: skip
@example('{"usage_id":"r","customer_id":"a","meter":"m","quantity":1,"quantity":-1,'
         '"occurred_at":"2026-12-02T10:15:00Z"}')  # fmt: skip
def test_a_flat_record_of_any_scalars_gets_the_same_verdict(text: str) -> None:
    _same(text.encode("utf-8", "surrogatepass"))


@QUICK
@given(st.sampled_from(["utf-16", "utf-32", "utf-8-sig", "latin-1"]), _flat_records())
def test_a_record_in_another_encoding_gets_the_same_verdict(encoding: str, text: str) -> None:
    _same(text.encode(encoding, "replace"))


@pytest.mark.parametrize("limit", [0, 10, 130, 131, 16 * 1024])
def test_the_size_limit_gets_the_same_verdict(limit: int) -> None:
    body = "{" + ",".join(f'"{k}":{v}' for k, v in VALID.items()) + "}"
    _same(body.encode(), limit)


def test_a_float_quantity_stays_exact_on_the_fast_decoder() -> None:
    raw = (
        b'{"usage_id":"r","customer_id":"a","meter":"m","quantity":12345678901234567890.123456789,'
        b'"occurred_at":"2026-12-02T10:15:00Z"}'
    )
    assert decode_usage_fast(raw).quantity == Decimal("12345678901234567890.123456789")


# Printable ASCII; a string that starts or ends with ':' or ',' next to its quote takes
# the reference (the separators' spaces would land inside it), as do escapes.
_PLAIN = st.text(st.characters(min_codepoint=32, max_codepoint=126, exclude_characters=':,"\\'))


@QUICK
@given(st.dictionaries(_PLAIN, st.one_of(_PLAIN, st.integers(-(2**63), 2**63 - 1))))
def test_the_fast_path_reads_records_as_json_dumps_writes_them(body: dict[str, object]) -> None:
    """Compact and Python's default separators both take the fast path (no fallback)."""
    compact = orjson.dumps(body)
    assert compact == json.dumps(body, separators=(",", ":")).encode()
    assert _spaced(compact) == json.dumps(body).encode()
