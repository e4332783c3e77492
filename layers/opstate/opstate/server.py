"""``opstate serve``: the Lambda's API app behind a local, threaded HTTP server.

Each HTTP request becomes an API Gateway HTTP API (payload format 2.0) event and goes through
``opstate.api.create_app(...).resolve(event, context)`` — the same routes, signature checks and
JSON responses as in AWS. The embedded SQLite store is the default; the reconciler runs on a
timer when a Gemini API key is configured; every state change is printed as one line.

Shutdown (SIGINT / SIGTERM): stop accepting, let in-flight requests finish, stop the
reconciler, close the store. Everything acknowledged with a 200 has been written.
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import os
import secrets as secrets_module
import shlex
import signal
import sys
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from types import FrameType
from typing import Any, TextIO
from urllib.parse import parse_qsl, unquote, urlsplit

from opstate.config import Settings
from opstate.reducer import Decision
from opstate.times import format_time

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 3000
DEFAULT_RECONCILE_EVERY_S = 300.0
DEFAULT_SECRET_FILE = Path(".opstate") / "webhook-secret"
WEBHOOK_PATH = "/gemini/webhook"
OPERATIONS_PREFIX = "/operations/"
# API Gateway refuses payloads over 10 MB before the function runs; so does this server.
MAX_REQUEST_BYTES = 10 * 1024 * 1024
# A client that sends nothing for this long is dropped (keeps shutdown bounded).
REQUEST_TIMEOUT_S = 15.0
# Requests answered at once (each worker thread keeps one store connection).
DEFAULT_WORKERS = 16
SECRET_PREFIX = "whsec_"


# --------------------------------------------------------------------------------------------
# Webhook secrets (local)


def generate_secret() -> str:
    """A Standard Webhooks secret: ``whsec_`` + base64 of 32 random bytes."""
    return SECRET_PREFIX + base64.b64encode(secrets_module.token_bytes(32)).decode("ascii")


def read_secret_file(path: Path) -> list[str]:
    """The secrets in a local secret file: one per line (or whitespace-separated), newest first."""
    text = path.read_text(encoding="utf-8")
    return [token for token in text.split() if token and not token.startswith("#")]


def write_secret_file(path: Path, secrets: Sequence[str]) -> None:
    """Write ``secrets`` (newest first) atomically, readable by the owner only (mode 0600)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write("".join(f"{s}\n" for s in secrets))
        os.chmod(tmp, 0o600)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        raise


class SecretFileProvider:
    """The secrets of a local file, re-read when the file changes on disk.

    ``opstate webhooks register`` / ``rotate`` rewrite the file while ``opstate serve`` runs;
    the next request sees the new secrets without a restart. If the file vanishes or cannot be
    read, the last secrets read stay in use.
    """

    def __init__(self, path: Path) -> None:
        self._path = path
        self._lock = threading.Lock()
        self._stamp: tuple[int, int] | None = None
        self._secrets: tuple[str, ...] = tuple(read_secret_file(path))

    def __call__(self) -> tuple[str, ...]:
        with self._lock:
            try:
                stat = self._path.stat()
                stamp = (stat.st_mtime_ns, stat.st_size)
                if stamp != self._stamp:
                    found = tuple(read_secret_file(self._path))
                    if found:
                        self._secrets = found
                    self._stamp = stamp
            except OSError:
                pass
            return self._secrets


@dataclasses.dataclass(frozen=True)
class SecretSource:
    """Where the webhook secrets come from, for the start-up banner."""

    secrets: tuple[str, ...]
    origin: str  # "env" or "file"
    path: Path | None
    generated: bool


def resolve_secrets(settings: Settings, secret_file: Path) -> SecretSource:
    """``OPSTATE_WEBHOOK_SECRETS`` if set; else the secret file, generated once if missing."""
    if settings.webhook_secrets:
        return SecretSource(tuple(settings.webhook_secrets), "env", None, False)
    path = secret_file.resolve()
    generated = False
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        secret = generate_secret()
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            pass  # another process created it first: use theirs
        else:
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                fh.write(secret + "\n")
            os.chmod(path, 0o600)
            generated = True
    found = read_secret_file(path)
    if not found:
        raise ValueError(f"the webhook secret file {path} holds no secret")
    return SecretSource(tuple(found), "file", path, generated)


# --------------------------------------------------------------------------------------------
# HTTP request <-> API Gateway HTTP API v2 event


@dataclasses.dataclass(frozen=True)
class LocalLambdaContext:
    """The few Lambda context attributes the app and Powertools read.

    ``get_remaining_time_in_millis`` answers ``remaining_ms`` (tests set it to try a budget).
    """

    function_name: str = "opstate-local"
    function_version: str = "$LATEST"
    invoked_function_arn: str = "arn:aws:lambda:local:000000000000:function:opstate-local"
    memory_limit_in_mb: int = 512
    aws_request_id: str = ""
    log_group_name: str = "/aws/lambda/opstate-local"
    log_stream_name: str = "local"
    remaining_ms: int = 30_000

    def get_remaining_time_in_millis(self) -> int:
        return self.remaining_ms


def _route_key(method: str, path: str) -> tuple[str, dict[str, str] | None]:
    """The route API Gateway would match and the path parameters it would set."""
    if method == "POST" and path == WEBHOOK_PATH:
        return f"POST {WEBHOOK_PATH}", None
    if method in ("GET", "PUT") and path.startswith(OPERATIONS_PREFIX):
        rest = path[len(OPERATIONS_PREFIX) :]
        if rest:
            return f"{method} /operations/{{name+}}", {"name": unquote(rest)}
    return "$default", None


def build_event(
    method: str,
    target: str,
    headers: Sequence[tuple[str, str]],
    body: bytes,
    *,
    source_ip: str = "127.0.0.1",
    now: datetime | None = None,
) -> dict[str, Any]:
    """The API Gateway HTTP API (payload 2.0) event for one HTTP request.

    Header names are lower-cased and repeated headers joined with commas (cookies go to
    ``cookies``); the body is text when it is UTF-8, else base64 with ``isBase64Encoded``.
    """
    now = now or datetime.now(UTC)
    split = urlsplit(target)
    raw_path = split.path or "/"
    raw_query = split.query
    merged: dict[str, str] = {}
    cookies: list[str] = []
    for name, value in headers:
        key = name.lower()
        if key == "cookie":
            cookies.extend(c.strip() for c in value.split(";") if c.strip())
            continue
        merged[key] = f"{merged[key]},{value}" if key in merged else value
    query: dict[str, str] = {}
    for key, value in parse_qsl(raw_query, keep_blank_values=True):
        query[key] = f"{query[key]},{value}" if key in query else value
    route_key, path_parameters = _route_key(method, unquote(raw_path))
    request_id = uuid.uuid4().hex
    event: dict[str, Any] = {
        "version": "2.0",
        "routeKey": route_key,
        "rawPath": raw_path,
        "rawQueryString": raw_query,
        "headers": merged,
        "requestContext": {
            "accountId": "000000000000",
            "apiId": "local",
            "domainName": merged.get("host", "localhost"),
            "domainPrefix": merged.get("host", "localhost").split(".")[0],
            "http": {
                "method": method,
                "path": raw_path,
                "protocol": "HTTP/1.1",
                "sourceIp": source_ip,
                "userAgent": merged.get("user-agent", ""),
            },
            "requestId": request_id,
            "routeKey": route_key,
            "stage": "$default",
            "time": now.strftime("%d/%b/%Y:%H:%M:%S +0000"),
            "timeEpoch": int(now.timestamp() * 1000),
        },
        "isBase64Encoded": False,
    }
    if cookies:
        event["cookies"] = cookies
    if query:
        event["queryStringParameters"] = query
    if path_parameters is not None:
        event["pathParameters"] = path_parameters
    if body:
        try:
            event["body"] = body.decode("utf-8")
        except UnicodeDecodeError:
            event["body"] = base64.b64encode(body).decode("ascii")
            event["isBase64Encoded"] = True
    return event


def response_parts(result: Mapping[str, Any]) -> tuple[int, list[tuple[str, str]], bytes]:
    """Status, headers and body bytes of a resolver's (API Gateway v2) response."""
    status = int(result.get("statusCode", 200))
    headers: list[tuple[str, str]] = []
    for key, value in (result.get("headers") or {}).items():
        headers.append((str(key), str(value)))
    for key, values in (result.get("multiValueHeaders") or {}).items():
        headers.extend((str(key), str(v)) for v in values)
    headers.extend(("Set-Cookie", str(c)) for c in result.get("cookies") or ())
    raw = result.get("body")
    if raw is None:
        body = b""
    elif result.get("isBase64Encoded"):
        body = base64.b64decode(raw)
    else:
        body = str(raw).encode("utf-8")
    return status, headers, body


# --------------------------------------------------------------------------------------------
# The server


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


class LocalApp:
    """The API app behind the local server.

    ``opstate.api`` serialises ``resolve`` itself (Powertools keeps the current event on the
    router class), so one app instance serves every request thread.
    """

    def __init__(self, app: Any) -> None:
        self._app = app

    def resolve(self, event: dict[str, Any], context: Any) -> Mapping[str, Any]:
        try:
            result: Mapping[str, Any] = self._app.resolve(event, context)
        finally:
            _clear_metrics()
        return result


# --------------------------------------------------------------------------------------------
# Printing


class Printer:
    """Thread-safe line printer (stdout is shared by request and reconciler threads)."""

    def __init__(self, out: TextIO) -> None:
        self._out = out
        self._lock = threading.Lock()
        self._broken = False

    def __call__(self, line: str) -> None:
        with self._lock:
            if self._broken:
                return
            try:
                self._out.write(line + "\n")
                self._out.flush()
            except (OSError, ValueError):
                # stdout went away (a closed pipe): keep serving and, above all, keep shutdown
                # working; printing is best effort.
                self._broken = True


def change_line(decision: Decision, now_ns: int | None = None) -> str | None:
    """``<time>  <name>  <previous> -> <new>  v<version>`` for a state change, else None."""
    if not decision.state_changed or decision.record is None:
        return None
    record = decision.record
    previous = str(decision.previous.state) if decision.previous is not None else "(new)"
    stamp = format_time(now_ns if now_ns is not None else time.time_ns())
    stamp = stamp[:19] + "Z"
    return f"{stamp}  {record.name}  {previous} -> {record.state}  v{record.version}"


def curl_example(base_url: str, source: SecretSource) -> str:
    """A ready-to-paste shell snippet that signs and posts a test webhook (openssl + curl)."""
    if source.origin == "file" and source.path is not None:
        secret_expr = f"$(head -n1 {shlex.quote(str(source.path))})"
    else:
        secret_expr = '"${OPSTATE_WEBHOOK_SECRETS%% *}"'
    url = f"{base_url}{WEBHOOK_PATH}"
    return "\n".join(
        [
            f"  secret={secret_expr}",
            "  id=msg_$RANDOM$RANDOM; ts=$(date +%s)",
            '  body=\'{"type":"batch.succeeded","version":"v1","timestamp":"\'"$(date -u'
            ' +%Y-%m-%dT%H:%M:%SZ)"\'","data":{"id":"batches/demo-1"}}\'',
            "  key=$(printf %s \"${secret#whsec_}\" | base64 -d | od -An -vtx1 | tr -d ' \\n')",
            '  sig=$(printf %s "$id.$ts.$body" | openssl dgst -sha256 -mac HMAC'
            ' -macopt "hexkey:$key" -binary | base64)',
            f"  curl -sS -X POST {url} -H 'content-type: application/json' \\",
            '    -H "webhook-id: $id" -H "webhook-timestamp: $ts"'
            ' -H "webhook-signature: v1,$sig" -d "$body"; echo',
        ]
    )


# --------------------------------------------------------------------------------------------
# Reconciler thread


class ReconcileLoop:
    """Runs one reconciler pass now and then every ``every_s`` seconds until stopped."""

    def __init__(
        self,
        run_once: Callable[[], Mapping[str, Any]],
        every_s: float,
        say: Callable[[str], None],
    ) -> None:
        self._run_once = run_once
        self._every_s = every_s
        self._say = say
        self._stop = threading.Event()
        self._in_pass = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="opstate-reconcile", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.is_set():
            self._in_pass.set()
            try:
                result = self._run_once()
            except Exception as exc:
                self._say(f"reconcile: pass failed: {type(exc).__name__}: {exc}")
            else:
                summary = " ".join(f"{k}={v}" for k, v in result.items())
                self._say(f"reconcile: {summary}")
            finally:
                self._in_pass.clear()
            if self._stop.wait(self._every_s):
                return

    def stop(self, timeout_s: float | None = None) -> None:
        self._stop.set()
        if self._in_pass.is_set():
            self._say("stopping: waiting for the reconciler pass to finish")
        if self._thread.is_alive():
            self._thread.join(timeout_s)


# --------------------------------------------------------------------------------------------
# serve


@dataclasses.dataclass(frozen=True)
class ServeOptions:
    host: str = DEFAULT_HOST
    port: int = DEFAULT_PORT
    store_url: str | None = None
    reconcile_every_s: float = DEFAULT_RECONCILE_EVERY_S
    secret_file: Path = DEFAULT_SECRET_FILE
    verbose: bool = False


class ServeError(Exception):
    """An expected start-up failure (port in use, bad secret file): one sentence, exit 1."""


def _quiet_powertools(verbose: bool) -> None:
    """Locally, decisions are printed as lines: no EMF blobs, logs at warning level."""
    os.environ.setdefault("POWERTOOLS_METRICS_DISABLED", "true")
    from opstate.observability import logger

    if not verbose:
        logger.setLevel("WARNING")


def _clear_metrics() -> None:
    from opstate.observability import metrics

    with contextlib.suppress(Exception):
        metrics.clear_metrics()


def serve(options: ServeOptions, settings: Settings, out: TextIO = sys.stdout) -> int:
    """Run the local server until SIGINT / SIGTERM; returns the process exit code."""
    say = Printer(out)
    _quiet_powertools(options.verbose)

    from opstate.api import create_app
    from opstate.signatures import SecretsProviderVerifier, StaticSecretsVerifier
    from opstate.store import store_from_url

    store_url = options.store_url or settings.store_url
    settings = dataclasses.replace(settings, store_url=store_url)
    try:
        source = resolve_secrets(settings, options.secret_file)
    except (OSError, ValueError) as exc:
        raise ServeError(f"cannot set up the webhook secret: {exc}") from None
    verifier: Any
    if source.origin == "file" and source.path is not None:
        verifier = SecretsProviderVerifier(
            SecretFileProvider(source.path), tolerance_s=settings.webhook_tolerance_s
        )
    else:
        verifier = StaticSecretsVerifier(source.secrets, tolerance_s=settings.webhook_tolerance_s)

    store = store_from_url(store_url, settings)
    # SQLite has no TTL of its own: terminal records past their expires_at (applied time +
    # OPSTATE_RETENTION_DAYS when written) are removed at start-up.
    purge_expired = getattr(store, "purge_expired", None)
    if callable(purge_expired):
        purged = purge_expired()
        if purged:
            say(f"retention: removed {purged} terminal record(s) past their expires_at")

    def on_decision(decision: Decision) -> None:
        line = change_line(decision)
        if line is not None:
            say(line)

    # Built now: configuration errors surface before "listening".
    apps = LocalApp(
        create_app(store=store, verifier=verifier, settings=settings, on_decision=on_decision)
    )

    try:
        httpd = OpstateHTTPServer(
            (options.host, options.port), apps.resolve, say=say, verbose=options.verbose
        )
    except OSError as exc:
        store.close()
        raise ServeError(
            f"cannot listen on {options.host}:{options.port}: {exc.strerror or exc}"
        ) from None
    host, port = str(httpd.server_address[0]), int(httpd.server_address[1])
    base_url = f"http://{host}:{port}"

    say(f"opstate serve: store {store_url}")
    if source.origin == "env":
        say(f"webhook secrets: {len(source.secrets)} from OPSTATE_WEBHOOK_SECRETS")
    elif source.generated:
        say(f"webhook secret (generated, saved in {source.path} with mode 0600):")
        say(f"  {source.secrets[0]}")
    else:
        say(f"webhook secrets: {len(source.secrets)} from {source.path}")
    say(f"webhook URL: {base_url}{WEBHOOK_PATH}")
    say("  give Gemini the public https URL of a tunnel to it, e.g. with")
    say(f"  opstate webhooks register --url https://<your-tunnel>{WEBHOOK_PATH}")
    say("signed test webhook (paste into a shell):")
    say(curl_example(base_url, source))
    say(f"track a job: curl -sS -X PUT {base_url}/operations/batches/<id>")

    loop: ReconcileLoop | None = None
    if settings.gemini_api_key or settings.gemini_api_key_secret_arn:
        loop = _start_reconciler(store, settings, options.reconcile_every_s, say)
    else:
        say("reconciler: off (set GEMINI_API_KEY to poll Gemini)")

    stopping = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stopping.set()

    # Installed for the rest of the process: a repeated signal during shutdown changes nothing.
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, on_signal)
    worker = threading.Thread(
        target=httpd.serve_forever, kwargs={"poll_interval": 0.1}, name="opstate-http"
    )
    worker.start()
    say(f"listening on {base_url}")
    try:
        while not stopping.wait(0.5):
            pass
    finally:
        say("stopping: finishing in-flight requests")
        httpd.shutdown()  # the accept loop ends
        worker.join()
        httpd.server_close()  # closes the socket, joins every request thread
        if loop is not None:
            loop.stop()
        store.close()
        say("stopped")
    return 0


class AnnouncingStore:
    """A store wrapper that reports every successful write as a state change line.

    The reconciler has no decision hook; it ingests through this wrapper instead. ``ingest``
    reads (or is handed, on a lost race) the record it then replaces, in the same thread, so the
    last record seen per thread is the previous record of a successful replace.
    """

    def __init__(self, inner: Any, on_write: Callable[[Any, Any, bool], None]) -> None:
        self._inner = inner
        self._on_write = on_write
        self._seen = threading.local()

    def _remember(self, record: Any) -> None:
        self._seen.record = record

    def _previous(self, name: str, version: int) -> Any:
        record = getattr(self._seen, "record", None)
        if record is not None and record.name == name and record.version == version:
            return record
        return None

    def get(self, name: str) -> Any:
        record = self._inner.get(name)
        self._remember(record)
        return record

    def put_if_absent(self, record: Any) -> Any:
        outcome = self._inner.put_if_absent(record)
        if outcome.ok:
            self._on_write(None, record, True)
        else:
            self._remember(outcome.current)
        return outcome

    def replace_if_version(self, record: Any, expected_version: int) -> Any:
        previous = self._previous(record.name, expected_version)
        outcome = self._inner.replace_if_version(record, expected_version)
        if outcome.ok:
            self._on_write(previous, record, False)
        else:
            self._remember(outcome.current)
        return outcome

    def list_open(self, limit: int = 100) -> Any:
        return self._inner.list_open(limit)

    def iter_all(self) -> Any:
        return self._inner.iter_all()

    def close(self) -> None:
        self._inner.close()


def _start_reconciler(
    store: Any, settings: Settings, every_s: float, say: Callable[[str], None]
) -> ReconcileLoop:
    from opstate import reconcile

    # Each pass gets a bounded budget (no Lambda deadline here): the reconciler stops starting
    # work once less than its safety margin is left, so the budget must exceed the margin.
    budget_s = settings.reconcile_safety_margin_s + max(every_s, 30.0)
    memory = reconcile.PollMemory()
    client_box: list[Any] = []

    def on_write(previous: Any, record: Any, created: bool) -> None:
        if previous is not None and previous.state == record.state:
            return  # a refresh, not a state change
        if created:
            before = "(new)"
        elif previous is None:
            before = "?"
        else:
            before = str(previous.state)
        stamp = format_time(time.time_ns())[:19] + "Z"
        say(f"{stamp}  {record.name}  {before} -> {record.state}  v{record.version}  (poll)")

    announcing = AnnouncingStore(store, on_write)

    def run_once() -> Mapping[str, Any]:
        if not client_box:
            client_box.append(reconcile.make_client(settings))
        deadline = time.monotonic() + budget_s

        def remaining_ms() -> int:
            return int((deadline - time.monotonic()) * 1000)

        result = reconcile.reconcile_once(
            announcing, client_box[0], settings=settings, remaining_ms=remaining_ms, memory=memory
        )
        summary: Mapping[str, Any] = result.as_dict()
        return summary

    loop = ReconcileLoop(run_once, every_s, say)
    loop.start()
    say(f"reconciler: every {every_s:g} s")
    return loop
