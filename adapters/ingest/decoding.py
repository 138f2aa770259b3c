"""The ingest's usage decoder: ``domain.usage.decode_usage``'s verdicts, parsed by orjson.

``decode_usage`` parses with the standard library's ``json`` and number hooks that
bound every number's text and read it as ``int`` or ``Decimal`` (~5 us a record);
orjson parses a record in under 1 us. The fast path takes a record only when orjson's
reading is provably the reference's: a JSON object whose values are strings, integers,
booleans and nulls, written exactly as orjson writes that object back, compact or with
Python's default separators (``", "``, ``": "``): what ``json.dumps`` and most producers
send. Writing back proves there is no repeated key, whose earlier value (a float, a
number too long, deep nesting) the dict no longer shows. ``domain.usage.usage_from_json``
then judges the very same dict, so the verdict and the reason are the same. Everything
else takes ``decode_usage`` itself, whatever orjson made of it:

* a float anywhere: orjson reads it as an f64 (``12345678901234567890.1`` loses its
  tail), the reference as an exact ``Decimal`` within its bounds;
* an integer beyond 64 bits: orjson makes it a float (so the rule above takes it);
* a nested list or object: the reference refuses nesting Python cannot recurse into,
  and bounds numbers inside it, which orjson does not;
* other whitespace, escapes orjson does not write (``\\u00e9``, ``\\/``), repeated keys;
* anything orjson refuses (not UTF-8, a byte-order mark, ``NaN``, a lone surrogate,
  not JSON at all), and JSON that is not an object: the reference says why, in its
  own words. (Whether JSON nested about as deep as Python's recursion limit is "nested
  too deeply" depends on how deep the caller's stack is, for the reference too; the
  fallback runs it one frame deeper than a direct call would.)

``tests/unit/test_fast_decoder.py`` checks the two give the same record or the same
reason on arbitrary bytes and JSON.
"""

from __future__ import annotations

import orjson

from domain.usage import DEFAULT_MAX_RECORD_BYTES, UsageRecord, check_size, decode_usage
from domain.usage import usage_from_json as _judge

__all__ = ["decode_usage_fast"]

_FLAT = frozenset({str, int, bool, type(None)})


def decode_usage_fast(
    raw: bytes | None, *, max_bytes: int = DEFAULT_MAX_RECORD_BYTES
) -> UsageRecord:
    """``decode_usage(raw, max_bytes=max_bytes)``, faster for a flat record (see the
    module docstring); raises ``InvalidUsage`` with the same reason, and nothing else."""
    data = check_size(raw, max_bytes)
    try:
        parsed = orjson.loads(data)
    except orjson.JSONDecodeError:
        return decode_usage(data, max_bytes=max_bytes)
    if type(parsed) is not dict or not all(type(v) in _FLAT for v in parsed.values()):
        return decode_usage(data, max_bytes=max_bytes)
    written = orjson.dumps(parsed)
    if written != data and _spaced(written) != data:
        return decode_usage(data, max_bytes=max_bytes)
    return _judge(parsed)


def _spaced(compact: bytes) -> bytes:
    """``compact`` with Python's default separators. Spaces land only between tokens, or
    inside a string (then the bytes differ from what was parsed): never a new member."""
    return compact.replace(b'":', b'": ').replace(b',"', b', "')
