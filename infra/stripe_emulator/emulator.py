"""The :class:`StripeEmulator` facade: lifecycle, settings and the control API in Python.

This module owns the emulator object tests and tools use: it binds and serves
(:meth:`StripeEmulator.start`/:meth:`~StripeEmulator.stop`, or ``with``), exposes the
settings (:meth:`~StripeEmulator.set_faults`) and the views a test asserts on (ledger,
requests, invoice items...), and hands HTTP requests to the API pipeline and the control API.
"""

from __future__ import annotations

import json
import threading
import time
from types import TracebackType
from typing import Any, Self

from .api import Reply, handle_api
from .control import handle_control
from .errors import JsonObject
from .server import HttpServer
from .settings import DEFAULT_KEY_TTL_S
from .state import EmulatorState

__all__ = ["StripeEmulator"]


def _copy(value: object) -> Any:
    return json.loads(json.dumps(value))


class StripeEmulator:
    """The emulator, a context manager that serves on ``url`` while entered.

    ``with StripeEmulator() as emu: StripeClient(key, base_addresses={"api": emu.url})``.

    All state is guarded by one lock (``threading.Condition`` over it, so tests can await
    conditions such as "this idempotency key is in flight").
    """

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        key_ttl_s: float = DEFAULT_KEY_TTL_S,
        latency_ms: float = 0.0,
        error_rate: float = 0.0,
        outage: bool = False,
        outage_mode: str = "503",
        outage_seconds: float | None = None,
        rate_limit_per_s: int | None = None,
        drop_response_after_execute: int = 0,
        drop_response_probability: float = 0.0,
        seed: int | None = None,
        log_requests: bool = False,
    ) -> None:
        self._host = host
        self._port = port
        self.log_requests = log_requests
        self._server: HttpServer | None = None
        self._thread: threading.Thread | None = None
        initial: dict[str, object] = {
            "key_ttl_s": key_ttl_s,
            "latency_ms": latency_ms,
            "error_rate": error_rate,
            "outage": outage or outage_seconds is not None,  # a window implies an outage
            "outage_mode": outage_mode,
            "outage_seconds": outage_seconds,
            "rate_limit_per_s": rate_limit_per_s,
            "drop_response_after_execute": drop_response_after_execute,
            "drop_response_probability": drop_response_probability,
            "seed": seed,
        }
        self._state = EmulatorState(initial)  # validates the arguments (ValueError)

    # lifecycle ----------------------------------------------------------------------------

    def start(self) -> Self:
        """Bind and serve in a daemon thread.  Idempotent."""
        if self._server is None:
            self._server = HttpServer(
                (self._host, self._port),
                self._handle_api,
                self._handle_control,
                lambda: self.log_requests,
            )
            self._thread = threading.Thread(
                target=self._server.serve_forever,
                kwargs={"poll_interval": 0.05},
                name=f"stripe-emulator:{self.port}",
                daemon=True,
            )
            self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving and close the listening socket.  Idempotent."""
        server, thread = self._server, self._thread
        self._server, self._thread = None, None
        if server is not None:
            server.shutdown()
            server.server_close()
        if thread is not None:
            thread.join(timeout=5)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    @property
    def port(self) -> int:
        """The bound port (the requested one until :meth:`start`)."""
        if self._server is None:
            return self._port
        return int(self._server.server_address[1])

    @property
    def url(self) -> str:
        """``http://host:port``; only valid once started."""
        if self._server is None:
            raise RuntimeError("StripeEmulator is not started")
        return f"http://{self._host}:{self.port}"

    # settings -----------------------------------------------------------------------------

    def set_faults(self, **settings: object) -> dict[str, Any]:
        """Change any :class:`EmulatorSettings` field (partial update); return all settings."""
        with self._state.cond:
            self._state.faults.update(settings)
            self._state.cond.notify_all()
            return self._state.faults.view(time.monotonic())

    def faults(self) -> dict[str, Any]:
        """The current settings, with ``outage`` reflecting whether an outage is on right now."""
        with self._state.cond:
            return self._state.faults.view(time.monotonic())

    def reset(self) -> None:
        """Forget all objects, keys, ledger and request log; restore the start-up settings."""
        with self._state.cond:
            self._state.reset_locked()
            self._state.cond.notify_all()

    # views --------------------------------------------------------------------------------

    def ledger(self) -> list[dict[str, Any]]:
        """Every executed mutation, oldest first: request id, method, path, key, object id,
        params and time."""
        with self._state.cond:
            return _copy(self._state.ledger)  # type: ignore[no-any-return]

    def requests(self) -> list[dict[str, Any]]:
        """Every API request received, oldest first, with the status it got (None if none)."""
        with self._state.cond:
            return _copy(self._state.requests)  # type: ignore[no-any-return]

    def invoice_items(self, txn_id: str | None = None) -> list[dict[str, Any]]:
        """All invoice items ever created (live and deleted), each with ``deleted``."""
        with self._state.cond:
            return self._invoice_items_locked(txn_id, live_only=False)

    def live_invoice_items(self, txn_id: str | None = None) -> list[dict[str, Any]]:
        """Live (not deleted) invoice items, optionally only those with ``metadata.txn_id``."""
        with self._state.cond:
            return self._invoice_items_locked(txn_id, live_only=True)

    def health(self) -> dict[str, Any]:
        with self._state.cond:
            return {
                "ok": True,
                "uptime_s": round(time.monotonic() - self._state.started_at, 3),
                "faults": self._state.faults.view(time.monotonic()),
            }

    def wait_for_in_flight(self, idempotency_key: str, timeout: float = 5.0) -> bool:
        """Block until a request holding ``idempotency_key`` is executing; False on timeout."""
        with self._state.cond:
            return self._state.cond.wait_for(
                lambda: self._state.keys.in_flight(idempotency_key), timeout=timeout
            )

    # internals ----------------------------------------------------------------------------

    def _invoice_items_locked(self, txn_id: str | None, *, live_only: bool) -> list[JsonObject]:
        out: list[JsonObject] = []
        for record in self._state.store.items.values():
            if live_only and record.deleted:
                continue
            if txn_id is not None and record.obj["metadata"].get("txn_id") != txn_id:
                continue
            out.append(
                _copy({**record.obj, "deleted": record.deleted, "deleted_at": record.deleted_at})
            )
        return out

    def _handle_api(
        self,
        method: str,
        path: str,
        query: str,
        body: bytes,
        *,
        authorization: str | None,
        idempotency_key: str | None,
        stripe_version: str | None,
    ) -> Reply | None:
        return handle_api(
            self._state,
            method,
            path,
            query,
            body,
            authorization=authorization,
            idempotency_key=idempotency_key,
            stripe_version=stripe_version,
        )

    def _handle_control(self, method: str, path: str, query: str, body: bytes) -> Reply:
        return handle_control(self, method, path, query, body)
