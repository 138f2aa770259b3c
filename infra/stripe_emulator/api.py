"""The API request pipeline: from a parsed HTTP request to the reply (or a dropped one).

This module owns the order in which Stripe decides a request: outage, authentication, rate
limits, global then per endpoint (a 429 comes before the idempotency key is looked at),
injected 500, routing,
parameters, the idempotency key (replay, mismatch, in use), latency (slept with the key held
in flight, outside the lock), execution under the lock, saving the response under the key,
the ledger, and dropping the response after execution.  It also logs every request.
"""

from __future__ import annotations

import sys
import threading
import time
import traceback
from dataclasses import dataclass
from typing import Final

from .errors import (
    ApiError,
    JsonObject,
    auth_error,
    error_headers,
    injected_error,
    outage_error,
    rate_limit_error,
    should_retry,
)
from .forms import bearer_key, dumps, new_id, parse_form, request_pairs
from .idempotency import Claim
from .routes import Route, resolve
from .state import EmulatorState
from .store import Call, Result

__all__ = ["MUTATING_METHODS", "Reply", "handle_api"]

MUTATING_METHODS: Final = frozenset({"POST", "DELETE"})

Headers = tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class Reply:
    status: int
    body: bytes
    headers: Headers = ()


@dataclass
class _Job:
    route: Route
    method: str
    path: str
    params: JsonObject
    path_id: str | None
    request_id: str
    idempotency_key: str | None
    stripe_version: str | None
    claim: Claim | None = None


@dataclass(frozen=True)
class _Admission:
    reply: Reply | None = None
    job: _Job | None = None
    refuse: bool = False


def handle_api(
    state: EmulatorState,
    method: str,
    path: str,
    query: str,
    body: bytes,
    *,
    authorization: str | None,
    idempotency_key: str | None,
    stripe_version: str | None,
) -> Reply | None:
    """Answer one API request; ``None`` means: close the connection without a response."""
    request_id = new_id("req_", 14)
    record: JsonObject = {
        "request_id": request_id,
        "method": method,
        "path": path,
        "idempotency_key": idempotency_key,
        "status": None,
        "outcome": "pending",
        "at": time.time(),
    }
    headers = [("Request-Id", request_id), ("Stripe-Version", stripe_version or "emulator")]
    if idempotency_key is not None:
        headers.append(("Idempotency-Key", idempotency_key))
    with state.cond:
        state.requests.append(record)
        admission = _admit_locked(
            state,
            record,
            method=method,
            path=path,
            query=query,
            body=body,
            api_key=bearer_key(authorization),
            idempotency_key=idempotency_key,
            stripe_version=stripe_version,
        )
        latency_s = state.faults.settings.latency_ms / 1000.0
        late_s = None
        if admission.job is not None:
            late_s = state.faults.execute_late(admission.job.route.endpoint)
        if admission.reply is not None:
            record["status"] = admission.reply.status
        if late_s is not None:
            record["outcome"] = "held"
        state.cond.notify_all()
    if admission.refuse:
        return None
    if late_s is not None and admission.job is not None:
        _execute_later(state, admission.job, record, tuple(headers), late_s)
        return None  # the client gives up; Stripe still executes it, later
    if latency_s > 0:
        time.sleep(latency_s)  # with the key (if any) held in flight, the lock released
    if admission.job is not None:
        return _run(state, admission.job, record, tuple(headers))
    assert admission.reply is not None
    reply = admission.reply
    return Reply(reply.status, reply.body, (*headers, *reply.headers))


def _reject(record: JsonObject, error: ApiError, outcome: str) -> _Admission:
    record["outcome"] = outcome
    body = dumps(error.payload(str(record["request_id"])))
    return _Admission(reply=Reply(error.status, body, error_headers(error)))


def _admit_locked(
    state: EmulatorState,
    record: JsonObject,
    *,
    method: str,
    path: str,
    query: str,
    body: bytes,
    api_key: str | None,
    idempotency_key: str | None,
    stripe_version: str | None,
) -> _Admission:
    """Everything decided before execution: outage, auth, 429, injected 500, key lookup."""
    faults = state.faults
    now = time.monotonic()
    if faults.outage_active(now):
        if faults.settings.outage_mode == "refuse":
            record["outcome"] = "refused"
            return _Admission(refuse=True)
        return _reject(record, outage_error(), "outage")
    if api_key is None:
        return _reject(record, auth_error(), "unauthenticated")
    resolved = resolve(method, path)
    endpoint = f"{method} {path}" if resolved is None else resolved[0].endpoint
    limited = faults.rate_limited(now, endpoint)
    if limited is not None:
        error = rate_limit_error(endpoint if limited == "endpoint" else None)
        return _reject(record, error, "rate_limited")
    if faults.inject_error():
        return _reject(record, injected_error(), "injected_error")
    if resolved is None:
        error = ApiError(
            404, "invalid_request_error", f"Unrecognized request URL ({method}: {path})."
        )
        return _reject(record, error, "rejected")
    try:
        pairs = request_pairs(method, query, body)
        params = parse_form(pairs)
    except ApiError as exc:
        return _reject(record, exc, "rejected")
    route, path_id = resolved
    request_id = str(record["request_id"])
    job = _Job(route, method, path, params, path_id, request_id, idempotency_key, stripe_version)
    if idempotency_key is None or method not in MUTATING_METHODS:
        return _Admission(job=job)
    fingerprint = (method, path, tuple(sorted(pairs)))
    ttl = faults.settings.key_ttl_s
    claim = state.keys.claim(api_key, idempotency_key, fingerprint, request_id, now=now, ttl=ttl)
    if claim.error is not None:
        return _reject(record, claim.error, claim.outcome)
    assert claim.entry is not None
    if claim.outcome == "replayed":
        record["outcome"] = "replayed"
        entry = claim.entry
        return _Admission(reply=Reply(entry.status, entry.body, entry.replay_headers()))
    job.claim = claim
    return _Admission(job=job)


def _execute_later(
    state: EmulatorState, job: _Job, record: JsonObject, headers: Headers, delay_s: float
) -> None:
    """Execute ``job`` ``delay_s`` from now on a thread of its own (its key stays in
    flight until then, so a retry under the same key gets 409, as from Stripe)."""

    def run() -> None:
        time.sleep(delay_s)
        _run(state, job, record, headers)
        with state.cond:
            record["outcome"] = "executed_late"
            state.cond.notify_all()

    threading.Thread(target=run, name="late-execute", daemon=True).start()


def _run(state: EmulatorState, job: _Job, record: JsonObject, headers: Headers) -> Reply | None:
    """Execute an admitted request under the lock, save it under its key, maybe drop it."""
    with state.cond:
        status, body, extra, executed = _execute_locked(state, job)
        drop = executed and job.method in MUTATING_METHODS and state.faults.drop_next()
        record["status"] = status
        record["outcome"] = "dropped" if drop else "executed"
        state.cond.notify_all()
    if drop:
        return None
    return Reply(status, body, (*headers, *extra))


def _execute_locked(state: EmulatorState, job: _Job) -> tuple[int, bytes, Headers, bool]:
    """Run the handler; returns status, body, extra headers and whether it executed.

    "Executed" means the endpoint ran (a success, or an error raised after execution began,
    e.g. an unknown customer); such results are saved under the idempotency key.  Parameter
    validation failures and emulator bugs are not saved, so a retry with the key runs anew.
    """
    call = Call(
        job.params,
        job.path_id,
        int(time.time()),
        job.request_id,
        job.idempotency_key,
        job.stripe_version,
    )
    saved = True
    extra: Headers = ()
    result: Result | None
    try:
        result = job.route.handler(state.store, call)
        status, body = result.status, dumps(result.payload)
        retry = should_retry(status)
        extra = () if retry is None else (("Stripe-Should-Retry", retry),)
    except ApiError as exc:
        result, saved = None, exc.saved
        status, body, extra = exc.status, dumps(exc.payload(job.request_id)), error_headers(exc)
    except Exception:  # a bug in the emulator: report it like Stripe would, do not save it
        traceback.print_exc(file=sys.stderr)
        result, saved = None, False
        error = ApiError(500, "api_error", "The Stripe emulator failed unexpectedly.")
        status, body, extra = 500, dumps(error.payload(job.request_id)), error_headers(error)
    claim = job.claim
    if claim is not None and claim.entry is not None and claim.scope is not None:
        state.keys.finish(claim.scope, claim.entry, status, body, saved=saved)
    if result is not None and result.mutated:
        state.ledger.append(
            {
                "request_id": job.request_id,
                "method": job.method,
                "path": job.path,
                "idempotency_key": job.idempotency_key,
                "object_id": result.object_id,
                "params": job.params,
                "at": time.time(),
            }
        )
    return status, body, extra, saved
