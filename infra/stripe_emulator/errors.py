"""Stripe's error responses: the ``{"error": {...}}`` shape, its status codes and headers.

This module owns :class:`ApiError` (raised by handlers and by the request pipeline), the
constructors of the errors the emulator answers with (validation, missing object, outage,
authentication, rate limit, injected 500, idempotency), and the ``Stripe-Should-Retry``
header rule.  It holds no state.
"""

from __future__ import annotations

from typing import Any, Final

__all__ = [
    "DOC_URL",
    "ApiError",
    "JsonObject",
    "auth_error",
    "error_headers",
    "idempotency_in_use",
    "idempotency_mismatch",
    "injected_error",
    "invalid",
    "missing",
    "outage_error",
    "rate_limit_error",
    "should_retry",
    "state_error",
]

JsonObject = dict[str, Any]

DOC_URL: Final = "https://stripe.com/docs/error-codes/"


class ApiError(Exception):
    """A Stripe error response.  ``saved`` is False for validation failures (not replayed)."""

    def __init__(
        self,
        status: int,
        type_: str,
        message: str,
        *,
        code: str | None = None,
        param: str | None = None,
        saved: bool = True,
        headers: tuple[tuple[str, str], ...] = (),
        extra: JsonObject | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.type = type_
        self.message = message
        self.code = code
        self.param = param
        self.saved = saved
        self.headers = headers
        self.extra = extra or {}

    def payload(self, request_id: str | None) -> JsonObject:
        error: JsonObject = {"type": self.type, "message": self.message}
        if self.code is not None:
            error["code"] = self.code
            error["doc_url"] = DOC_URL + self.code.replace("_", "-")
        if self.param is not None:
            error["param"] = self.param
        error.update(self.extra)
        if request_id is not None:
            error["request_log_url"] = f"https://dashboard.stripe.com/test/logs/{request_id}"
        return {"error": error}


def invalid(message: str, param: str | None = None, *, code: str | None = None) -> ApiError:
    """A parameter validation failure: 400, not saved under the idempotency key."""
    return ApiError(400, "invalid_request_error", message, param=param, code=code, saved=False)


def state_error(message: str, param: str | None = None, *, code: str | None = None) -> ApiError:
    """A refusal decided by the objects' state (executed): 400, saved under the key."""
    return ApiError(400, "invalid_request_error", message, param=param, code=code)


def missing(kind: str, object_id: str, param: str, status: int = 404) -> ApiError:
    return ApiError(
        status,
        "invalid_request_error",
        f"No such {kind}: '{object_id}'",
        code="resource_missing",
        param=param,
    )


def should_retry(status: int) -> str | None:
    """The ``Stripe-Should-Retry`` value Stripe sends with ``status`` (None: no header)."""
    if status in (409, 429) or status >= 500:
        return "true"
    if 400 <= status < 500:
        return "false"
    return None


def error_headers(error: ApiError) -> tuple[tuple[str, str], ...]:
    retry = should_retry(error.status)
    base = error.headers
    return base if retry is None else (*base, ("Stripe-Should-Retry", retry))


def outage_error() -> ApiError:
    return ApiError(503, "api_error", "Stripe is temporarily unavailable (emulated outage).")


def auth_error() -> ApiError:
    return ApiError(
        401,
        "invalid_request_error",
        "You did not provide an API key. You need to provide your API key in the "
        "Authorization header, using Bearer auth (e.g. 'Authorization: Bearer YOUR_SECRET_KEY').",
    )


def rate_limit_error(endpoint: str | None = None) -> ApiError:
    scope = "Request rate limit exceeded"
    if endpoint is not None:
        scope += f" for {endpoint}"
    return ApiError(
        429,
        "rate_limit_error",
        f"{scope}. Learn more about rate limits here https://stripe.com/docs/rate-limits.",
        code="rate_limit",
        headers=(("Retry-After", "1"),),
    )


def injected_error() -> ApiError:
    return ApiError(500, "api_error", "An unknown error occurred (injected by the emulator).")


def idempotency_mismatch(key: str) -> ApiError:
    return ApiError(
        400,
        "idempotency_error",
        "Keys for idempotent requests can only be used with the same parameters they were first "
        f"used with. Try using a key other than '{key}' if you meant to execute a different "
        "request.",
        code="idempotency_key_mismatch",
    )


def idempotency_in_use(key: str) -> ApiError:
    return ApiError(
        409,
        "idempotency_error",
        f"There is currently another in-progress request using this idempotent key ('{key}'). "
        "That probably means you submitted twice, and the other request is still going "
        "through. Please try again later.",
        code="idempotency_key_in_use",
    )
