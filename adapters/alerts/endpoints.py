"""Which webhook URLs may be called: http(s) only, and never an address inside.

An alert webhook is a request this service makes to a URL someone typed, so a URL must
not reach what only this host can reach (server-side request forgery): the metadata
service (169.254.169.254), loopback, the private ranges, link-local, multicast and the
reserved ones. ``resolve_target`` refuses such a URL when it is registered, and resolves
and checks it again at each delivery (DNS can change after registration) and returns the
address to connect to, so the request goes to the address that was checked, not to
whatever a second lookup answers. Every address a name resolves to must be public: a
name with one private address among public ones is refused.

``allow_private`` (the setting ``ALERT_WEBHOOK_ALLOW_PRIVATE``) lifts the address check
(a receiver on this host or inside the network; the tests' receiver on 127.0.0.1); the
scheme and the host are still checked.

Exceptions: ``UnsafeUrl`` (Raised when a webhook URL is not one this service may call).
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit

__all__ = [
    "MAX_URL_LENGTH",
    "Resolver",
    "Target",
    "UnsafeUrl",
    "resolve_target",
    "system_resolver",
]

MAX_URL_LENGTH = 2048

Resolver = Callable[[str, int], Sequence[str]]


class UnsafeUrl(ValueError):
    """Raised when a webhook URL is not one this service may call."""


@dataclass(frozen=True)
class Target:
    """Where a delivery connects: the URL's parts and the checked address."""

    scheme: str
    host: str
    port: int
    path: str  # with the query, at least "/"
    address: str


def system_resolver(host: str, port: int) -> list[str]:
    """Every address ``host`` resolves to (UnsafeUrl when it does not resolve)."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError) as exc:
        raise UnsafeUrl(f"{host} does not resolve: {exc}") from None
    return [str(info[4][0]) for info in infos]


def resolve_target(url: str, *, allow_private: bool, resolve: Resolver = system_resolver) -> Target:
    """``url``'s target, if this service may call it (UnsafeUrl with the reason if
    not): parsed, its host resolved, every address checked. Run at registration and
    again at each delivery."""
    if len(url) > MAX_URL_LENGTH:
        raise UnsafeUrl(f"a webhook URL is at most {MAX_URL_LENGTH} characters")
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise UnsafeUrl(f"not a URL: {exc}") from None
    scheme = parts.scheme.lower()
    if scheme not in ("http", "https"):
        raise UnsafeUrl(f"{url!r}: only http and https URLs, not {scheme or 'none'!r}")
    host = parts.hostname
    if not host:
        raise UnsafeUrl(f"{url!r}: no host")
    if parts.username is not None or parts.password is not None:
        raise UnsafeUrl(f"{url!r}: credentials in a webhook URL are refused")
    port = port or (443 if scheme == "https" else 80)
    addresses = list(resolve(host, port))
    if not addresses:
        raise UnsafeUrl(f"{host} does not resolve")
    if not allow_private:
        for address in addresses:
            reason = _inside(address)
            if reason:
                raise UnsafeUrl(f"{host} resolves to {address}, {reason}: refused")
    path = parts.path or "/"
    if parts.query:
        path = f"{path}?{parts.query}"
    return Target(scheme, host, port, path, addresses[0])


def _inside(address: str) -> str:
    """Why ``address`` must not be called ("" when it is a public address)."""
    try:
        ip = ipaddress.ip_address(address.split("%", 1)[0])
    except ValueError:
        return "not an IP address"
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    checks = (
        (ip.is_loopback, "a loopback address"),
        (ip.is_link_local, "a link-local address (cloud metadata among them)"),
        (ip.is_unspecified, "the unspecified address"),
        (ip.is_multicast, "a multicast address"),
        (ip.is_private, "a private address"),
        (ip.is_reserved, "a reserved address"),
        (not ip.is_global, "not a public address"),
    )
    return next((reason for hit, reason in checks if hit), "")
