"""The HTTP stack the webhook listener and the health server share (``adapters.http``)."""

from __future__ import annotations

import http.client
import socket

from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from adapters.http.server import HttpLimits, HttpServer


def test_accepted_connections_send_without_nagle_delay() -> None:
    """Every accepted connection has TCP_NODELAY: without it a response's head and body
    (two writes) met the client's delayed ACK and each keep-alive request took ~40 ms."""
    app = Starlette(routes=[Route("/", lambda _: PlainTextResponse("ok"))])
    server = HttpServer(app, "127.0.0.1", 0, HttpLimits(), name="nodelay-test")
    server.start()
    assert server.wait_started()
    client = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
    try:
        client.request("GET", "/")
        reply = client.getresponse()
        assert (reply.status, reply.read()) == (200, b"ok")
        assert server._server is not None
        connections = list(server._server.server_state.connections)
        assert connections, "the keep-alive connection is still open"
        for protocol in connections:
            sock = protocol.transport.get_extra_info("socket")
            assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) == 1
    finally:
        client.close()
        server.stop()
