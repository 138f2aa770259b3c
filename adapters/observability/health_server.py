"""The health server ``billing-ledger run`` starts: liveness, readiness, queue health,
metrics, and the read models as JSON.

=====================  =============================================================
``GET /healthz``       200 while the process serves requests
``GET /readyz``        200 when the database and the broker are reachable, else 503
``GET /health``        the queue-health figures, each worker's heartbeat and breaker,
                       consumer lag, and ``status`` (ok, degraded, failing) with
                       ``reasons``; 503 when failing or the database is unreachable
``GET /metrics``       Prometheus text format (``adapters.observability.metrics``)
``GET /balances``      ``?customer=C``: ``billing.customer_balances`` rows
``GET /transactions``  ``?state=S&customer=C&limit=N``: ``billing.transactions`` rows
=====================  =============================================================

Query parameters are validated before any SQL runs and reach it only as bound
parameters; an unknown or invalid parameter is a 400 with the reason, never a 500.
Served by the standard library's threading HTTP server: a handful of requests a
minute from a probe and a scraper need nothing more.
"""

from __future__ import annotations

import hmac
import json
import logging
import threading
import time
from collections.abc import Mapping
from http import HTTPStatus
from typing import Any
from urllib.parse import parse_qs

import anyio
import anyio.to_thread
import psycopg
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from adapters.broker import check_reachable
from adapters.http.server import HttpLimits, HttpServer
from adapters.observability.metrics import CONTENT_TYPE, metrics
from adapters.settings import Settings
from domain.health import FAILING, Thresholds, assess
from projections.balances import balances
from projections.base import InvalidFilter
from projections.queue_health import read_health
from projections.transactions import page_cursor, transactions
from store.connections import Database

__all__ = [
    "FIGURES",
    "HealthProbe",
    "HealthServer",
    "health_app",
    "health_report",
    "health_thresholds",
    "render",
]

log = logging.getLogger(__name__)


def health_report(conn: psycopg.Connection[Any], limits: Thresholds) -> dict[str, Any]:
    """Status, reasons and every queue-health figure, from the database."""
    figures = read_health(conn)
    status, reasons = assess(figures, limits)
    return {"status": status, "reasons": reasons, **figures}


def health_thresholds(settings: Settings) -> Thresholds:
    """The health policy's thresholds from the settings."""
    return Thresholds(
        max_consumer_lag=settings.health_max_consumer_lag,
        max_dead_letters_last_hour=settings.health_max_dead_letters_per_hour,
    )


class HealthProbe:
    """Reads queue health (cached for ``cache_s``) and checks the services."""

    def __init__(self, settings: Settings, *, cache_s: float = 1.0) -> None:
        self.settings = settings
        # Its own connections, quick to give up: a probe answers even when workers wait.
        password = settings.database_password.get_secret_value() or None
        self.database = Database(
            settings.database_url,
            pool_size=0,
            connect_timeout_s=3,
            statement_timeout_ms=3000,
            password=password,
        )
        self.limits = health_thresholds(settings)
        self.cache_s = cache_s
        self._cached: tuple[float, dict[str, Any]] | None = None
        self._guard = threading.Lock()

    def report(self) -> dict[str, Any]:
        """The health report; status failing with the reason when the database is down."""
        with self._guard:
            if self._cached and time.monotonic() - self._cached[0] < self.cache_s:
                return self._cached[1]
        try:
            with self.database.connection() as conn:
                report = health_report(conn, self.limits)
        except psycopg.OperationalError as exc:
            report = {"status": FAILING, "reasons": [f"database unreachable: {_first_line(exc)}"]}
        except psycopg.Error as exc:  # e.g. no view: the schema was never prepared
            report = {"status": FAILING, "reasons": [f"health query failed: {_first_line(exc)}"]}
        with self._guard:  # a failure is cached too: a hung database costs one timeout
            self._cached = (time.monotonic(), report)
        return report

    def figures(self) -> Mapping[str, Any] | None:
        """The figures for the metrics gauges (None when the database is unreachable)."""
        report = self.report()
        return report if "backlog_reserved" in report else None

    def readiness(self) -> dict[str, str]:
        """``ok`` or the error, for the database and the broker."""
        checks = {"database": self._database, "broker": self._broker}
        result: dict[str, str] = {}
        for name, check in checks.items():
            try:
                check()
                result[name] = "ok"
            except Exception as exc:  # a probe reports, it does not raise
                result[name] = _first_line(exc)
        return result

    def _database(self) -> None:
        with self.database.connection() as conn:
            conn.execute("SELECT 1")

    def _broker(self) -> None:
        check_reachable(self.settings.kafka_bootstrap)


class HealthServer:
    """Serves the endpoints above on ``host:port`` (``adapters.http.server``: uvicorn and
    Starlette, with its header deadline) from a thread of its own.

    Capacity is kept apart: liveness and metrics answer from the event loop without a
    thread or a query; readiness and health share two worker threads; the data
    endpoints two others. A flood of slow data requests waits for its own threads and
    idle or trickling sockets cost the loop nothing but a timer (closed when their head
    is late), so neither starves ``/healthz``.
    """

    def __init__(
        self,
        probe: HealthProbe,
        host: str,
        port: int,
        *,
        token: str = "",
        limits: HttpLimits | None = None,
    ) -> None:
        self.probe = probe
        metrics().use_figures(probe.figures)
        chosen = limits or HttpLimits(header_timeout_s=10.0, limit_concurrency=256)
        self.http = HttpServer(health_app(probe, token), host, port, chosen, name="health")
        try:
            self.http.start()
        except OSError as exc:
            raise OSError(
                f"health server cannot listen on {host}:{port}: {exc.strerror}"
                " (set BILLING_LEDGER_HEALTH_PORT or --health-port; 0 turns it off)"
            ) from None
        self.port = self.http.port

    def __enter__(self) -> HealthServer:
        self.http.wait_started()
        log.info("health server listening", extra={"step": "health", "port": self.port})
        return self

    def __exit__(self, *exc: object) -> None:
        self.http.stop()


_ROUTES: dict[str, frozenset[str]] = {
    "/healthz": frozenset(),
    "/readyz": frozenset(),
    "/health": frozenset(),
    "/metrics": frozenset(),
    "/balances": frozenset({"customer"}),
    "/transactions": frozenset({"state", "customer", "limit", "after"}),
}
_DATA = frozenset({"/balances", "/transactions"})
_HEADERS = {"Cache-Control": "no-store", "X-Content-Type-Options": "nosniff"}


def health_app(probe: HealthProbe, token: str) -> Starlette:
    """The ASGI app of the health server (see the module docstring)."""
    probes = anyio.CapacityLimiter(2)  # readiness and health: their own threads
    data = anyio.CapacityLimiter(2)  # the read models: others

    async def endpoint(request: Request) -> Response:
        path = request.url.path
        if path not in _ROUTES:
            return _json(HTTPStatus.NOT_FOUND, {"error": f"no such endpoint {path}"})
        if path in _DATA and not _authorized(request.headers.get("authorization"), token):
            return _json(
                HTTPStatus.UNAUTHORIZED,
                {"error": "a bearer token is required (Authorization: Bearer ...)"},
                {"WWW-Authenticate": 'Bearer realm="billing-ledger"'},
            )
        try:
            params = _params(request.url.query, _ROUTES[path])
            if path == "/healthz":
                return _json(HTTPStatus.OK, {"status": "alive"})
            if path == "/metrics":
                return Response(metrics().render(), headers=_HEADERS, media_type=CONTENT_TYPE)
            limiter = data if path in _DATA else probes
            return await anyio.to_thread.run_sync(_answer, probe, path, params, limiter=limiter)
        except InvalidFilter as exc:
            return _json(HTTPStatus.BAD_REQUEST, {"error": str(exc)})
        except Exception as exc:  # a failing backend is a 503 with the reason
            log.warning("health endpoint %s failed: %s", path, _first_line(exc))
            return _json(HTTPStatus.SERVICE_UNAVAILABLE, {"error": _first_line(exc)})

    return Starlette(routes=[Route(p, endpoint, methods=["GET"]) for p in _ROUTES])


def _answer(probe: HealthProbe, path: str, params: dict[str, str]) -> Response:
    """A probe's or a read model's answer, in a worker thread (they query)."""
    if path == "/readyz":
        body: Any = probe.readiness()
        bad = any(v != "ok" for v in body.values())
        return _json(HTTPStatus.SERVICE_UNAVAILABLE if bad else HTTPStatus.OK, body)
    if path == "/health":
        body = probe.report()
        failing = body["status"] == FAILING
        return _json(HTTPStatus.SERVICE_UNAVAILABLE if failing else HTTPStatus.OK, body)
    limit = _int_param(params, "limit", 50)
    with probe.database.connection() as conn:
        if path == "/balances":
            return _json(HTTPStatus.OK, balances(conn, customer=params.get("customer")))
        rows = transactions(
            conn,
            state=params.get("state"),
            customer=params.get("customer"),
            limit=limit,
            after=params.get("after"),
        )
    more = {"X-Next-After": page_cursor(rows[-1])} if len(rows) == limit else {}
    return _json(HTTPStatus.OK, rows, more)


def _authorized(header: str | None, token: str) -> bool:
    """Whether ``header`` is ``Bearer <token>`` (constant time; no token set: never)."""
    if not token or header is None:
        return False
    scheme, _, given = header.partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(
        given.strip().encode(), token.encode()
    )


def _json(status: HTTPStatus, body: Any, headers: Mapping[str, str] | None = None) -> Response:
    return Response(
        _dumps(body),
        status_code=status,
        headers={**_HEADERS, **(headers or {})},
        media_type="application/json",
    )


def _params(query: str, allowed: frozenset[str]) -> dict[str, str]:
    """The query parameters, each given once and known to the endpoint (else InvalidFilter)."""
    parsed = parse_qs(query, keep_blank_values=True, strict_parsing=False)
    unknown = sorted(set(parsed) - allowed)
    if unknown:
        known = ", ".join(sorted(allowed)) or "none"
        raise InvalidFilter(f"unknown parameter(s) {', '.join(unknown)} (allowed: {known})")
    repeated = sorted(k for k, v in parsed.items() if len(v) > 1)
    if repeated:
        raise InvalidFilter(f"parameter(s) given more than once: {', '.join(repeated)}")
    return {k: v[0] for k, v in parsed.items()}


def _int_param(params: Mapping[str, str], name: str, default: int) -> int:
    if name not in params:
        return default
    try:
        return int(params[name])
    except ValueError:
        raise InvalidFilter(f"invalid {name} {params[name]!r}: a whole number") from None


def _dumps(body: Any) -> bytes:
    return json.dumps(body, separators=(",", ":"), default=str).encode()


def _first_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return f"{type(exc).__name__}: {text}"


# The figures the terminal shows (``render``, ``adapters.cli.health_watch``), in order.
FIGURES = (
    ("backlog_metered", "backlog: metered"),
    ("backlog_reserved", "backlog: reserved"),
    ("backlog_charge_failed", "backlog: charge failed"),
    ("oldest_open_age_s", "oldest unfinished (s)"),
    ("retries_due", "retries due now"),
    ("retries_overdue", "retries overdue"),
    ("stale_reserved", "reserved, not charged"),
    ("past_deadline", "past their deadline"),
    ("dead_letters_last_hour", "dead letters, last hour"),
    ("conflicting_duplicates_last_hour", "conflicting duplicates, last hour"),
    ("dead_letters_total", "dead letters, ever"),
    ("stripe_errors_1m", "Stripe errors, 1 min"),
    ("stripe_errors_5m", "Stripe errors, 5 min"),
    ("stripe_errors_15m", "Stripe errors, 15 min"),
    ("charges_last_minute", "charges, last minute"),
    ("max_consumer_lag", "largest consumer lag"),
    ("workers_alive", "workers alive"),
    ("workers_silent", "workers silent"),
    ("breakers_not_closed", "breakers not closed"),
    ("projector_behind", "projector behind (events)"),
)


def render(report: Mapping[str, Any]) -> str:
    """The health report as the terminal table ``billing-ledger health`` prints."""
    lines = [f"status: {report['status']}"]
    lines += [f"  - {reason}" for reason in report["reasons"]]
    if "backlog_reserved" not in report:
        return "\n".join(lines)
    lines.append("")
    width = max(len(label) for _, label in FIGURES)
    for key, label in FIGURES:
        value = report[key]
        shown = f"{value:.1f}" if isinstance(value, float) else str(value)
        lines.append(f"{label:<{width}}  {shown}")
    for name, counts in sorted(report["stripe_errors_by_class"].items()):
        lines.append(f"{'  ' + name:<{width}}  {counts['1m']} / {counts['5m']} / {counts['15m']}")
    if report["workers"]:
        lines += ["", "workers:"]
        for w in report["workers"]:
            alive = "alive" if w["alive"] else "SILENT"
            breaker = w["breaker_state"] or "-"
            lines.append(
                f"  {w['worker_id']:<40} {alive:<6} breaker {breaker:<9}"
                f" last beat {w['heartbeat_at']}"
            )
    if report["consumer_lag"]:
        lines += ["", "consumer lag:"]
        for row in report["consumer_lag"]:
            lines.append(
                f"  {row['group_name']} {row['topic']}[{row['partition']}]: {row['lag']}"
                f" (committed {row['committed_offset']}, end {row['end_offset']})"
            )
    return "\n".join(lines)
