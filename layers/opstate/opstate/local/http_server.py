"""The HTTP server of ``opstate serve``: each request becomes an API Gateway v2 event for a
resolver (``opstate.local.apigw``), and the resolver's answer becomes the HTTP response."""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any

from opstate.local.apigw import LocalLambdaContext, build_event, response_parts

# API Gateway refuses payloads over 10 MB before the function runs; so does this server.
MAX_REQUEST_BYTES = 10 * 1024 * 1024
# A client that sends nothing for this long is dropped (keeps shutdown bounded).
REQUEST_TIMEOUT_S = 15.0
# Requests answered at once (each worker thread keeps one store connection).
DEFAULT_WORKERS = 16

Resolver = Callable[[dict[str, Any], Any], Mapping[str, Any]]


class _Handler(BaseHTTPRequestHandler):
    server: OpstateHTTPServer
    protocol_version = "HTTP/1.0"  # one request per connection: shutdown never waits on idle peers
    timeout = REQUEST_TIMEOUT_S
    server_version = "opstate"
    sys_version = ""

    def _serve(self) -> None:
        try:
            body = self._read_body()
        except _BodyError as exc:
            self._send(exc.status, [("Content-Type", "application/json")], exc.body)
            return
        event = build_event(
            self.command,
            self.path,
            list(self.headers.items()),
            body,
            source_ip=self.client_address[0],
        )
        context = LocalLambdaContext(aws_request_id=event["requestContext"]["requestId"])
        try:
            result = self.server.resolve(event, context)
        except Exception as exc:  # the app answers its own errors; this is a bug
            self.server.report_error(f"{self.command} {self.path}: {type(exc).__name__}: {exc}")
            payload = b'{"error": "internal-error", "message": "internal error"}'
            self._send(500, [("Content-Type", "application/json")], payload)
            return
        status, headers, payload = response_parts(result)
        self._send(status, headers, payload)

    def _read_body(self) -> bytes:
        if "chunked" in (self.headers.get("Transfer-Encoding") or "").lower():
            return self._read_chunked()
        length_text = self.headers.get("Content-Length")
        if not length_text:
            return b""
        try:
            length = int(length_text)
        except ValueError:
            raise _BodyError(400, "invalid-request", "invalid Content-Length") from None
        if length < 0:
            raise _BodyError(400, "invalid-request", "invalid Content-Length")
        if length > MAX_REQUEST_BYTES:
            self.close_connection = True
            raise _BodyError(413, "payload-too-large", "request body too large")
        return self.rfile.read(length)

    def _read_chunked(self) -> bytes:
        chunks: list[bytes] = []
        total = 0
        while True:
            line = self.rfile.readline(1024)
            try:
                size = int(line.split(b";", 1)[0].strip() or b"x", 16)
            except ValueError:
                raise _BodyError(400, "invalid-request", "invalid chunked encoding") from None
            if size == 0:
                while self.rfile.readline(1024).strip():
                    pass
                return b"".join(chunks)
            total += size
            if total > MAX_REQUEST_BYTES:
                self.close_connection = True
                raise _BodyError(413, "payload-too-large", "request body too large")
            chunks.append(self.rfile.read(size))
            self.rfile.readline(1024)

    def _send(self, status: int, headers: Sequence[tuple[str, str]], body: bytes) -> None:
        self.send_response(status)
        seen = set()
        for key, value in headers:
            if key.lower() in ("content-length", "connection", "transfer-encoding"):
                continue
            seen.add(key.lower())
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Connection", "close")
        self.end_headers()
        if self.command != "HEAD" and body:
            self.wfile.write(body)

    do_GET = do_PUT = do_POST = do_DELETE = do_PATCH = do_HEAD = do_OPTIONS = _serve

    def log_message(self, format: str, *args: Any) -> None:
        if self.server.verbose:
            self.server.say(f"{self.address_string()} {format % args}")


class _BodyError(Exception):
    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.body = ('{"error": "' + code + '", "message": "' + message + '"}').encode("utf-8")


class OpstateHTTPServer(HTTPServer):
    """An HTTP server answering on a fixed pool of worker threads.

    A bounded pool (not a thread per request) keeps the per-thread store connections bounded.
    ``server_close`` closes the socket, then waits until every accepted request was answered.
    """

    allow_reuse_address = True
    request_queue_size = 128

    def __init__(
        self,
        address: tuple[str, int],
        resolve: Resolver,
        *,
        say: Callable[[str], None],
        verbose: bool = False,
        workers: int = DEFAULT_WORKERS,
    ) -> None:
        self.resolve = resolve
        self.say = say
        self.verbose = verbose
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="opstate-http")
        try:
            super().__init__(address, _Handler)
        except BaseException:
            self._pool.shutdown(wait=False)
            raise

    def process_request(self, request: Any, client_address: Any) -> None:
        self._pool.submit(self._work, request, client_address)

    def _work(self, request: Any, client_address: Any) -> None:
        try:
            self.finish_request(request, client_address)
        except Exception:
            self.handle_error(request, client_address)
        finally:
            self.shutdown_request(request)

    def handle_error(self, request: Any, client_address: Any) -> None:
        exc = sys.exc_info()[1]
        if isinstance(exc, ConnectionError | TimeoutError):
            return  # the client went away
        self.report_error(f"request from {client_address[0]}: {type(exc).__name__}: {exc}")

    def server_close(self) -> None:
        super().server_close()
        self._pool.shutdown(wait=True)

    def report_error(self, message: str) -> None:
        self.say(f"error: {message}")
