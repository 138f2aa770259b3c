"""Stripe's list and search envelopes.

This module owns cursor pagination (``limit``, ``starting_after``, ``ending_before``,
``has_more`` over objects kept newest first) and the search subset the emulator speaks:
``metadata['key']:'value'`` and ``field:'value'`` clauses joined by ``AND``, answered as a
``search_result`` page with ``page``/``next_page``.  It holds no state.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Final

from .errors import ApiError, JsonObject, invalid
from .forms import opt_str, parse_int

__all__ = [
    "LIST_PARAMS",
    "Clause",
    "created_filter",
    "limit",
    "list_page",
    "matches",
    "parse_query",
    "search_page",
]

LIST_PARAMS: Final = frozenset({"limit", "starting_after", "ending_before", "expand"})
"""The parameters every list endpoint accepts."""

_CLAUSE_RE: Final = re.compile(
    r"""\s*metadata\[(?P<kq>['"])(?P<key>(?:\\.|(?!(?P=kq)).)*)(?P=kq)\]"""
    r"""\s*:\s*(?P<vq>['"])(?P<value>(?:\\.|(?!(?P=vq)).)*)(?P=vq)\s*"""
)
_FIELD_RE: Final = re.compile(
    r"""\s*(?P<field>[a-z_]+)"""
    r"""\s*:\s*(?P<vq>['"])(?P<value>(?:\\.|(?!(?P=vq)).)*)(?P=vq)\s*"""
)
_AND_RE: Final = re.compile(r"AND(?=\s)")
_ESCAPE_RE: Final = re.compile(r"\\(.)")


def limit(params: JsonObject) -> int:
    raw = params.get("limit")
    return 10 if raw is None else parse_int(raw, "limit", low=1, high=100)


def list_page(
    records: Sequence[tuple[int, JsonObject]],
    params: JsonObject,
    url: str,
    cursor: Callable[[str, str], int],
) -> JsonObject:
    """A ``list`` page over ``(seq, object)`` pairs given newest first (descending seq).

    ``cursor(object_id, param)`` gives the seq of a cursor object or raises the endpoint's
    "no such object" error.
    """
    size = limit(params)
    after = opt_str(params, "starting_after")
    before = opt_str(params, "ending_before")
    if after is not None and before is not None:
        raise invalid(
            "You may only specify one of these parameters: ending_before, starting_after.",
            "ending_before",
        )
    if after is not None:
        seq = cursor(after, "starting_after")
        rest = [r for r in records if r[0] < seq]
        page, has_more = rest[:size], len(rest) > size
    elif before is not None:
        seq = cursor(before, "ending_before")
        rest = [r for r in records if r[0] > seq]
        page, has_more = rest[-size:], len(rest) > size
    else:
        page, has_more = list(records[:size]), len(records) > size
    return {"object": "list", "data": [r[1] for r in page], "has_more": has_more, "url": url}


def created_filter(params: JsonObject) -> Callable[[int], bool]:
    """The ``created`` filter of a list: an exact timestamp or ``created[gt|gte|lt|lte]``."""
    raw = params.get("created")
    if raw is None or raw == "":
        return lambda created: True
    if isinstance(raw, str):
        exact = parse_int(raw, "created", low=0, high=2**63)
        return lambda created: created == exact
    bounds: dict[str, int] = {}
    for op, value in raw.items():
        if op not in ("gt", "gte", "lt", "lte"):
            raise invalid(f"Received unknown parameter: created[{op}]", f"created[{op}]")
        bounds[op] = parse_int(value, f"created[{op}]", low=0, high=2**63)

    def within(created: int) -> bool:
        return (
            ("gt" not in bounds or created > bounds["gt"])
            and ("gte" not in bounds or created >= bounds["gte"])
            and ("lt" not in bounds or created < bounds["lt"])
            and ("lte" not in bounds or created <= bounds["lte"])
        )

    return within


@dataclass(frozen=True)
class Clause:
    """One search condition: ``metadata[key]`` (``field`` None) or a top-level field."""

    field: str | None
    key: str
    value: str


def _unsupported(query: str, fields: frozenset[str]) -> ApiError:
    names = ", ".join(sorted(fields)) or "none"
    return invalid(
        "The emulator only supports queries of the form metadata['key']:'value' or "
        f"field:'value' (fields: {names}) joined by AND; got: {query}",
        "query",
    )


def parse_query(query: str, fields: frozenset[str] = frozenset()) -> list[Clause]:
    """Parse ``metadata['k']:'v'`` and ``field:'v'`` clauses joined by ``AND``."""
    clauses: list[Clause] = []
    pos = 0
    while True:
        match = _CLAUSE_RE.match(query, pos)
        if match is not None:
            key = _ESCAPE_RE.sub(r"\1", match["key"])
            clauses.append(Clause(None, key, _ESCAPE_RE.sub(r"\1", match["value"])))
        else:
            match = _FIELD_RE.match(query, pos)
            if match is None or match["field"] not in fields:
                raise _unsupported(query, fields)
            value = _ESCAPE_RE.sub(r"\1", match["value"])
            clauses.append(Clause(match["field"], match["field"], value))
        pos = match.end()
        if pos == len(query):
            return clauses
        joiner = _AND_RE.match(query, pos)
        if joiner is None:
            raise invalid(f"Unsupported search query: {query}", "query")
        pos = joiner.end()


def matches(obj: JsonObject, clauses: Sequence[Clause]) -> bool:
    """Whether ``obj`` satisfies every clause (exact string comparison)."""
    for clause in clauses:
        if clause.field is None:
            actual = obj.get("metadata", {}).get(clause.key)
        else:
            value = obj.get(clause.field)
            actual = None if value is None else str(value)
        if actual != clause.value:
            return False
    return True


def search_page(objects: list[JsonObject], params: JsonObject, url: str) -> JsonObject:
    """A ``search_result`` page over ``objects`` (already newest first)."""
    size = limit(params)
    offset = 0
    page = params.get("page")
    if page not in (None, ""):
        match = re.fullmatch(r"page_(\d+)", str(page))
        if match is None:
            raise invalid(f"Invalid page: {page}", "page")
        offset = int(match.group(1))
    chunk = objects[offset : offset + size]
    has_more = offset + size < len(objects)
    return {
        "object": "search_result",
        "data": chunk,
        "has_more": has_more,
        "next_page": f"page_{offset + size}" if has_more else None,
        "url": url,
    }
