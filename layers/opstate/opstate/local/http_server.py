"""The HTTP server of ``opstate serve``, on waitress.

waitress parses HTTP (request line, headers, chunked bodies), enforces the size limits, runs
the thread pool and closes connections; this module keeps only the translation of one WSGI
request into an API Gateway v2 event for a resolver (``opstate.local.apigw``) and of the
resolver's answer back, the JSON bodies of the errors waitress answers itself, and the
shutdown order ``serve`` promises: stop accepting, let the requests being answered finish
(nothing new starts), flush what they wrote, close.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from http import HTTPStatus
from typing import Any
from urllib.parse import quote

from waitress import wasyncore
from waitress.adjustments import Adjustments
from waitress.channel import HTTPChannel
from waitress.parser import HTTPRequestParser
from waitress.receiver import ChunkedReceiver
from waitress.server import TcpWSGIServer
from waitress.task import ErrorTask, ThreadedTaskDispatcher
from waitress.utilities import BadRequest

from opstate.local.apigw import LocalLambdaContext, build_event, response_parts
from opstate.terminal import printable

# API Gateway refuses payloads over 10 MB before the function runs; so does this server.
MAX_REQUEST_BYTES = 10 * 1024 * 1024
# waitress counts chunked framing as body bytes: its own cap leaves room for the framing, the
# exact cap on the body is checked here.
_WAITRESS_BODY_CAP = MAX_REQUEST_BYTES + 64 * 1024
# A chunk-size line and a chunked trailer are small; longer ones are refused (400).
MAX_CHUNK_LINE_BYTES = 1024
MAX_TRAILER_BYTES = 64 * 1024
# A connection that sends nothing for this long is closed (keeps shutdown bounded).
REQUEST_TIMEOUT_S = 15
# Requests answered at once (each worker thread keeps one store connection). Measured
# (benchmarks/bench_serve_workers.py): throughput is flat from 2 to 32; reads stay fast while
# writes wait on SQLite's lock only with more workers than waiting writes (docs/local.md).
DEFAULT_WORKERS = 16
# Shutdown waits this long for the requests being answered, then this long for their output.
SHUTDOWN_WAIT_S = 60.0
FLUSH_WAIT_S = 5.0

Resolver = Callable[[dict[str, Any], Any], Mapping[str, Any]]
StartResponse = Callable[..., Any]

# Headers only the server may set (PEP 3333's hop-by-hop headers and the body length).
_SERVER_HEADERS = frozenset(
    (
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailers",
        "transfer-encoding",
        "upgrade",
        "content-length",
    )
)


def error_body(code: str, message: str) -> bytes:
    """The JSON error body the API answers with: ``{"error": code, "message": message}``."""
    return json.dumps({"error": code, "message": message}).encode("utf-8")


TOO_LARGE_BODY = error_body(
    "payload-too-large", f"the body is larger than {MAX_REQUEST_BYTES} bytes"
)


def _status_line(status: int) -> str:
    try:
        return f"{status} {HTTPStatus(status).phrase}"
    except ValueError:
        return f"{status} Unknown"


# --------------------------------------------------------------------------------------------
# WSGI request <-> resolver


def _request_headers(environ: Mapping[str, Any]) -> list[tuple[str, str]]:
    headers: list[tuple[str, str]] = []
    for key, value in environ.items():
        if key.startswith("HTTP_"):
            headers.append((key[5:].replace("_", "-").lower(), str(value)))
        elif key in ("CONTENT_TYPE", "CONTENT_LENGTH") and value:
            headers.append((key.replace("_", "-").lower(), str(value)))
    return headers


def _request_target(environ: Mapping[str, Any]) -> str:
    raw = environ.get("REQUEST_URI")
    if isinstance(raw, str) and raw:
        return raw
    path = quote(environ.get("SCRIPT_NAME", "") + environ.get("PATH_INFO", ""))
    query = environ.get("QUERY_STRING", "")
    return f"{path}?{query}" if query else path


class ApiGatewayApp:
    """A WSGI application: one HTTP request, one API Gateway v2 event through ``resolve``."""

    def __init__(
        self,
        resolve: Resolver,
        *,
        say: Callable[[str], None],
        verbose: bool = False,
    ) -> None:
        self._resolve = resolve
        self._say = say
        self._verbose = verbose

    def __call__(self, environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        method = str(environ.get("REQUEST_METHOD", "GET"))
        target = _request_target(environ)
        status, headers, payload = self._answer(environ, method, target)
        if self._verbose:
            protocol = environ.get("SERVER_PROTOCOL", "HTTP/1.1")
            self._say(
                printable(
                    f'{environ.get("REMOTE_ADDR", "-")} "{method} {target} {protocol}" '
                    f"{status} {len(payload)}"
                )
            )
        out = [(k, v) for k, v in headers if k.lower() not in _SERVER_HEADERS]
        out.append(("Content-Length", str(len(payload))))
        start_response(_status_line(status), out)
        return [payload] if method != "HEAD" else [b""]

    def _answer(
        self, environ: Mapping[str, Any], method: str, target: str
    ) -> tuple[int, Sequence[tuple[str, str]], bytes]:
        json_type = [("Content-Type", "application/json")]
        try:
            length = int(environ.get("CONTENT_LENGTH") or 0)
        except ValueError:
            return 400, json_type, error_body("invalid-request", "invalid Content-Length")
        if length > MAX_REQUEST_BYTES:
            return 413, json_type, TOO_LARGE_BODY
        body = environ["wsgi.input"].read(length) if length > 0 else b""
        event = build_event(
            method,
            target,
            _request_headers(environ),
            body,
            source_ip=str(environ.get("REMOTE_ADDR") or "127.0.0.1"),
        )
        context = LocalLambdaContext(aws_request_id=event["requestContext"]["requestId"])
        try:
            result = self._resolve(event, context)
        except Exception as exc:  # the app answers its own errors; this is a bug
            self._say(printable(f"error: {method} {target}: {type(exc).__name__}: {exc}"))
            return 500, json_type, error_body("internal-error", "internal error")
        return response_parts(result)


# --------------------------------------------------------------------------------------------
# waitress, with our error bodies and bounded chunk lines


_ERROR_CODES = {
    400: ("invalid-request", None),
    413: ("payload-too-large", f"the body is larger than {MAX_REQUEST_BYTES} bytes"),
    431: ("headers-too-large", "the request headers are too large"),
    501: ("not-implemented", None),
}


class _JsonErrorTask(ErrorTask):  # type: ignore[misc]
    """waitress's own refusals (malformed request, too large) with the API's JSON body."""

    def execute(self) -> None:
        error = self.request.error
        status = int(getattr(error, "code", 500))
        code, message = _ERROR_CODES.get(status, ("internal-error", "internal error"))
        if message is None:
            message = str(getattr(error, "body", "") or getattr(error, "reason", ""))[:200]
        body = error_body(code, message)
        self.status = _status_line(status)
        self.response_headers.append(("Content-Type", "application/json"))
        self.set_close_on_finish()
        self.content_length = len(body)
        self.write(body)


class _BoundedParser(HTTPRequestParser):  # type: ignore[misc]
    """waitress's request parser with a bound on chunk-size lines and on the trailer.

    waitress already accepts only hex digits as a chunk size; both lines would otherwise only
    be bounded by the body cap.
    """

    def received(self, data: bytes) -> int:
        consumed: int = super().received(data)
        chunked = self.body_rcv
        if (
            not self.completed  # type: ignore[has-type]
            and isinstance(chunked, ChunkedReceiver)
            and (
                len(chunked.control_line) > MAX_CHUNK_LINE_BYTES
                or len(chunked.trailer) > MAX_TRAILER_BYTES
            )
        ):
            self.error = BadRequest("a chunk-size line or the chunked trailer is too long")
            self.completed = True
        return consumed


class _Channel(HTTPChannel):  # type: ignore[misc]
    parser_class = _BoundedParser
    error_task_class = _JsonErrorTask


class _Server(TcpWSGIServer):  # type: ignore[misc]
    channel_class = _Channel


class LocalHTTPServer:
    """A waitress server on ``host:port`` for one WSGI application, run on its own thread.

    ``start`` serves; ``shutdown`` closes the listening socket, lets the worker threads finish
    the requests they are answering (queued ones never start), waits until their answers are
    flushed, then closes every connection.
    """

    def __init__(
        self,
        host: str,
        port: int,
        app: Callable[[dict[str, Any], StartResponse], Iterable[bytes]],
        *,
        workers: int = DEFAULT_WORKERS,
    ) -> None:
        adj = Adjustments(
            host=host,
            port=port,
            threads=workers,
            ident="opstate",
            max_request_body_size=_WAITRESS_BODY_CAP,
            channel_timeout=REQUEST_TIMEOUT_S,
            cleanup_interval=5,
            clear_untrusted_proxy_headers=False,
            asyncore_use_poll=True,
        )
        self._map: dict[int, Any] = {}
        self._dispatcher = ThreadedTaskDispatcher()
        self._server = _Server(
            app, map=self._map, dispatcher=self._dispatcher, adj=adj, sockinfo=adj.listen[0]
        )  # OSError when the address is taken
        self.host = str(self._server.effective_host)
        self.port = int(self._server.effective_port)
        self._dispatcher.set_thread_count(workers)
        self._stopping = threading.Event()
        self._not_accepting = threading.Event()
        self._draining = threading.Event()
        self._thread = threading.Thread(target=self._run, name="opstate-http")

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        flush_deadline: float | None = None
        try:
            while True:
                wasyncore.loop(timeout=0.5, map=self._map, use_poll=True, count=1)
                if self._stopping.is_set() and not self._not_accepting.is_set():
                    wasyncore.dispatcher.close(self._server)  # the listening socket only
                    self._not_accepting.set()
                if self._draining.is_set():
                    if flush_deadline is None:
                        flush_deadline = time.monotonic() + FLUSH_WAIT_S
                    if self._flushed() or time.monotonic() > flush_deadline:
                        return
        finally:
            self._not_accepting.set()
            self._close_all()

    def _channels(self) -> list[Any]:
        return [c for c in list(self._map.values()) if isinstance(c, HTTPChannel)]

    def _flushed(self) -> bool:
        return all(not c.total_outbufs_len for c in self._channels())

    def _close_all(self) -> None:
        for channel in self._channels():
            channel.handle_close()
        self._server.trigger.close()
        wasyncore.dispatcher.close(self._server)
        self._map.clear()

    def shutdown(self, wait_s: float = SHUTDOWN_WAIT_S) -> None:
        """Stop as described in the class docstring; returns once everything is closed."""
        if not self._thread.is_alive():
            self._dispatcher.shutdown(cancel_pending=True, timeout=wait_s)
            self._close_all()
            return
        self._stopping.set()
        self._wake()
        self._not_accepting.wait()
        self._dispatcher.shutdown(cancel_pending=True, timeout=wait_s)
        self._draining.set()
        self._wake()
        self._thread.join()

    def _wake(self) -> None:
        with contextlib.suppress(OSError):  # the loop already ended and closed the trigger
            self._server.pull_trigger()
