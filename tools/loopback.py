"""A small HTTP server on 127.0.0.1 that answers POSTs, for webhook receivers: the
demo's (``tools.demo_credits``) and the tests'."""

from __future__ import annotations

import threading
from collections.abc import Callable
from email.message import Message
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

__all__ = ["Answer", "serve_posts"]

# What a POST gets: from its body and headers, the status and any headers to send, and
# optionally a body (none when left out).
Answer = Callable[
    [bytes, "Message[str, str]"],
    tuple[int, dict[str, str]] | tuple[int, dict[str, str], bytes],
]


def serve_posts(
    answer: Answer, path: str, *, keep_alive: bool = True
) -> tuple[ThreadingHTTPServer, str]:
    """A server on a free loopback port, serving in a daemon thread, each POST answered
    by ``answer`` (in a thread of its own); the server (``shutdown`` and
    ``server_close`` it) and the URL of ``path`` on it. It keeps connections open
    (HTTP/1.1), as most receivers do, unless ``keep_alive`` is False (HTTP/1.0: closed
    after each answer)."""

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1" if keep_alive else "HTTP/1.0"

        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["Content-Length"]))
            status, headers, *rest = answer(body, self.headers)
            reply = rest[0] if rest else b""
            self.send_response(status)
            for name, value in headers.items():
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(reply)))
            self.end_headers()
            self.wfile.write(reply)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}{path}"
