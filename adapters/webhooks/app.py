"""The webhook listener: one route, ``POST /webhooks/stripe``, on an address of its
own (``WEBHOOK_HOST``/``WEBHOOK_PORT``; Stripe must reach it, the health server
stays private), served by ``adapters.http.server`` (uvicorn and Starlette) with a
header deadline, a body deadline and size limit and bounded concurrency.

The handler's database work runs in a worker thread, at most
``WEBHOOK_MAX_CONCURRENCY`` at a time; requests beyond that wait for a slot and
uvicorn answers 503 past its connection limit. Any other path: 404; another method:
405.
"""

from __future__ import annotations

import anyio
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from adapters.http.server import BodyRefused, HttpLimits, HttpServer, read_body
from adapters.webhooks.handler import WebhookHandler, WebhookOutcome

__all__ = ["PATH", "webhook_app", "webhook_server"]

PATH = "/webhooks/stripe"
_HEADERS = {"Cache-Control": "no-store", "X-Content-Type-Options": "nosniff"}


def webhook_app(handler: WebhookHandler, limits: HttpLimits, max_concurrency: int) -> Starlette:
    slots = anyio.CapacityLimiter(max_concurrency)

    async def receive(request: Request) -> Response:
        try:
            body = await read_body(request, limits)
        except BodyRefused as refused:
            outcome = (
                WebhookOutcome.TOO_LARGE if refused.status == 413 else WebhookOutcome.SLOW_BODY
            )
            answer = await run_in_threadpool(handler.refuse, refused.status, outcome)
            return JSONResponse(answer.body, status_code=answer.status, headers=_HEADERS)
        signature = request.headers.get("stripe-signature")
        async with slots:
            answer = await run_in_threadpool(handler.handle, body, signature)
        return JSONResponse(answer.body, status_code=answer.status, headers=_HEADERS)

    return Starlette(routes=[Route(PATH, receive, methods=["POST"])])


def webhook_server(
    handler: WebhookHandler, host: str, port: int, limits: HttpLimits, max_concurrency: int
) -> HttpServer:
    """The listener, not started."""
    return HttpServer(
        webhook_app(handler, limits, max_concurrency), host, port, limits, name="webhooks"
    )
