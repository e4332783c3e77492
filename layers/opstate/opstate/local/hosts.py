"""Which ``Host`` names ``opstate serve`` answers (against DNS rebinding).

A web page on any site can make a browser send requests to ``127.0.0.1:3000`` under its own
name (DNS rebinding); such a request carries that site's name in ``Host``. So the server answers
only requests addressed to it by a loopback name (``localhost``, ``*.localhost``,
``127.0.0.0/8``, ``::1``), by the address it listens on (when not a wildcard), by the host of
``OPSTATE_PUBLIC_URL`` (the tunnel's public name) or by a name given with ``--allow-host``.
Anything else is answered 421 (a request without ``Host`` 400) before it reaches a route.
"""

from __future__ import annotations

import ipaddress
import json
from collections.abc import Callable, Iterable, Mapping
from typing import Any
from urllib.parse import urlsplit

WILDCARDS = frozenset({"", "0.0.0.0", "::", "*"})

StartResponse = Callable[..., Any]
WsgiApp = Callable[[dict[str, Any], StartResponse], Iterable[bytes]]


def host_name(value: str) -> str | None:
    """The name in a ``Host`` header value (port and IPv6 brackets removed, lower case), or
    None when it is not a well-formed ``host[:port]``."""
    value = value.strip().lower()
    if not value:
        return None
    if value.startswith("["):
        end = value.find("]")
        if end < 0 or (value[end + 1 :] and not _is_port(value[end + 2 :], value[end + 1])):
            return None
        return value[1:end]
    name, sep, port = value.rpartition(":") if value.count(":") == 1 else (value, "", "")
    if sep and not _is_port(port, ":"):
        return None
    return (name if sep else value).rstrip(".") or None


def _is_port(port: str, sep: str) -> bool:
    return sep == ":" and port.isascii() and port.isdigit() and len(port) <= 5


def is_loopback(name: str) -> bool:
    if name == "localhost" or name.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


class AllowedHosts:
    """The ``Host`` names one server answers (see the module docstring)."""

    def __init__(
        self, listen_host: str, public_url: str | None = None, extra: Iterable[str] = ()
    ) -> None:
        names = {n for n in (host_name(e) for e in extra) if n}
        listen = host_name(listen_host) if listen_host not in WILDCARDS else None
        if listen:
            names.add(listen)
        if public_url:
            public = urlsplit(public_url).hostname
            if public:
                names.add(public.lower().rstrip("."))
        self.names = frozenset(names)

    def allows(self, host_header: str) -> bool:
        name = host_name(host_header)
        return name is not None and (name in self.names or is_loopback(name))


def _refuse(start_response: StartResponse, status: str, code: str, message: str) -> list[bytes]:
    body = json.dumps({"error": code, "message": message}).encode("utf-8")
    start_response(
        status,
        [("Content-Type", "application/json"), ("Content-Length", str(len(body)))],
    )
    return [body]


class HostCheck:
    """WSGI middleware: requests for a name the server does not answer never reach ``app``."""

    def __init__(self, app: WsgiApp, allowed: AllowedHosts) -> None:
        self._app = app
        self._allowed = allowed

    def __call__(self, environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        host = _host_header(environ)
        if host is None:
            return _refuse(start_response, "400 Bad Request", "invalid-request", "no Host header")
        if not self._allowed.allows(host):
            return _refuse(
                start_response,
                "421 Misdirected Request",
                "misdirected-request",
                "this server answers only loopback names, the host of OPSTATE_PUBLIC_URL and "
                "names given with --allow-host",
            )
        return self._app(environ, start_response)


def _host_header(environ: Mapping[str, Any]) -> str | None:
    value = environ.get("HTTP_HOST")
    return value if isinstance(value, str) and value.strip() else None
