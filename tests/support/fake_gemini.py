"""A fake Gemini API server for tests and benchmarks (``http.server`` on 127.0.0.1).

It speaks the REST shapes google-genai 3.6 reads, so the *real* client can be pointed at it
(``GOOGLE_GEMINI_BASE_URL=fake.base_url`` or ``HttpOptions(base_url=fake.base_url)``). Paths may
carry any API version prefix (``/v1/``, ``/v1beta/``...); resources are keyed by their name
without it:

=====================================  =================================================
``GET  batches?pageSize&pageToken``    ``{"operations": [...], "nextPageToken": "..."}``
``GET  batches/{id}``                  an LRO: ``{"name", "metadata": {"state":
                                       "BATCH_STATE_*", "updateTime", ...}, "done"}``
``GET  models/{m}/operations/{id}``    an LRO: ``{"name", "done", "response"|"error"}``
``GET  <anything>/operations/{id}``    (file-search imports etc.), same shape
``GET  interactions/{id}``             ``{"id", "status", "created", "updated"}``
``GET  webhooks?page_size&page_token`` ``{"webhooks": [...], "next_page_token": "..."}``
                                       (the NextGen surface is snake_case on the wire)
``GET  files/{id}``                    a File: ``{"name", "sizeBytes", "expirationTime",
                                       "downloadUri", "source": "GENERATED", ...}``
``GET  files/{id}:download?alt=media`` its bytes, streamed from a generator (never held
                                       whole); ``cut`` / ``slow_download`` fault it
=====================================  =================================================

API (all thread-safe)::

    with FakeGemini() as fake:                      # or fake.start() / fake.stop()
        fake.put_batch("batches/a", "BATCH_STATE_RUNNING", update_time="2026-05-01T10:00:00Z")
        fake.put_video("models/veo-3.1-generate-preview/operations/v", done=True,
                       video_uri="https://.../v.mp4")            # or error_code=1 (cancelled)
        fake.put_interaction("interactions/i", "completed", updated="2026-05-01T10:00:00Z")
        fake.put_webhook("wh1", name="prod", state="disabled_due_to_failed_deliveries")
        fake.put("some/other/operations/x", {...})  # any raw JSON resource
        fake.fail("batches/a", 429, times=1)        # next N answers (None: until cleared)
        fake.delay("batches/a", 2.0)                # a slow resource (seconds)
        fake.request_delay = 0.05                   # added to every request
        fake.on_request("batches/a", fn)            # fn(request) runs before the answer
        fake.route("POST", r"webhooks", handler)    # handler(request) -> (status, json body)
        fake.put_file("out1", body=b"..." or chunks_fn, size=n,    # a generated file
                      expiration_time="2026-05-03T10:00:00Z")
        fake.put_file("gz", body=gzipped, content_encoding="gzip",  # sent encoded; its
                      declared_size=n, sha256_hash="...")  # File says sizeBytes n, sha256Hash
        fake.cut("files/out1", after=4 << 20, times=1)  # close mid-body after N bytes
        fake.close_delimited("files/out1")          # no Content-Length: the close ends it
        fake.slow_download("files/out1", 0.01)      # sleep between 1 MiB chunks
        fake.api_key = "k"                          # then a wrong x-goog-api-key gets 401
        fake.requests                               # every request, in arrival order
        fake.hits("batches/a")                      # how many requests named it
        fake.endless_listing("repeat")              # batches listing never ends ("fresh":
                                                    # a new next-page token on every page)

Uploads, batch create and cancel, and their helpers (``uploaded``, ``batches_created``,
``run_batch``, ``fail_create``, ``on_create``...) are in ``tests/support/fake_gemini_batches.py``.

Names given to ``put_*``/``fail``/``delay`` are resource names (``batches/a``); the list
endpoints are the collection names (``batches``, ``webhooks``). Errors are Google's JSON error
shape ``{"error": {"code", "message", "status"}}``.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

from tests.support.fake_gemini_batches import BodyStream, DropConnection, FakeBatches

API_VERSION = re.compile(r"v\d+(?:(?:alpha|beta)\d*)?")
STATUS_TEXT = {
    400: "INVALID_ARGUMENT",
    401: "UNAUTHENTICATED",
    403: "PERMISSION_DENIED",
    404: "NOT_FOUND",
    408: "DEADLINE_EXCEEDED",
    409: "ABORTED",
    429: "RESOURCE_EXHAUSTED",
    500: "INTERNAL",
    502: "UNAVAILABLE",
    503: "UNAVAILABLE",
    504: "DEADLINE_EXCEEDED",
}
TERMINAL_BATCH_STATES = frozenset(
    {"BATCH_STATE_SUCCEEDED", "BATCH_STATE_FAILED", "BATCH_STATE_CANCELLED", "BATCH_STATE_EXPIRED"}
)
DEFAULT_PAGE_SIZE = 50


@dataclass(frozen=True)
class Request:
    """One request as the fake saw it."""

    method: str
    path: str  # the raw path, e.g. /v1/batches/a
    name: str  # the resource name, e.g. batches/a ("" for the root)
    verb: str | None  # the ":verb" suffix, e.g. cancel
    api_version: str | None
    query: Mapping[str, list[str]]
    headers: Mapping[str, str]
    body: Any


Response = tuple[int, Any]
Handler = Callable[[Request], Response]


@dataclass
class _Fault:
    status: int
    times: int | None
    message: str
    retry_after: str | None = None


@dataclass
class FileBody:
    """A generated file's bytes: ``chunks()`` yields them afresh for every download (as sent:
    encoded with ``encoding`` when it is set)."""

    size: int
    chunks: Callable[[], Iterator[bytes]]
    encoding: str | None = None


@dataclass
class _Cut:
    after: int
    times: int | None


def repeated(block: bytes, size: int, chunk: int = 1 << 20) -> Callable[[], Iterator[bytes]]:
    """Chunks of ``block`` repeated up to ``size`` bytes (large bodies without holding them)."""

    def chunks() -> Iterator[bytes]:
        unit = block * max(1, chunk // max(1, len(block)))
        sent = 0
        while sent < size:
            piece = unit[: size - sent]
            sent += len(piece)
            yield piece

    return chunks


@dataclass
class _State:
    files: dict[str, FileBody] = field(default_factory=dict)
    cuts: dict[str, _Cut] = field(default_factory=dict)
    slow: dict[str, float] = field(default_factory=dict)
    unsized: set[str] = field(default_factory=set)
    resources: dict[str, dict[str, Any]] = field(default_factory=dict)
    faults: dict[str, _Fault] = field(default_factory=dict)
    delays: dict[str, float] = field(default_factory=dict)
    hooks: dict[str, Callable[[Request], None]] = field(default_factory=dict)
    routes: list[tuple[str, re.Pattern[str], Handler]] = field(default_factory=list)
    # The batch listing never ends: "repeat" gives the same next-page token on every page,
    # "fresh" a new one on every page (None: the listing ends after its last batch).
    endless: str | None = None


# --- REST shapes ---------------------------------------------------------------------------------


def batch_resource(
    name: str,
    state: str = "BATCH_STATE_RUNNING",
    *,
    update_time: str | None = "2026-05-01T10:00:00Z",
    create_time: str | None = "2026-05-01T09:00:00Z",
    display_name: str | None = None,
    model: str = "models/gemini-2.5-flash",
    responses_file: str | None = None,
    error: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """A batch as ``GET batches/{id}`` returns it: an LRO whose metadata is the batch."""
    if not state.startswith("BATCH_STATE_"):
        state = f"BATCH_STATE_{state}"
    metadata: dict[str, Any] = {
        "@type": "type.googleapis.com/google.ai.generativelanguage.v1main.GenerateContentBatch",
        "name": name,
        "model": model,
        "state": state,
    }
    if display_name is not None:
        metadata["displayName"] = display_name
    if create_time is not None:
        metadata["createTime"] = create_time
    if update_time is not None:
        metadata["updateTime"] = update_time
    if responses_file is not None:
        metadata["output"] = {"responsesFile": responses_file}
    body: dict[str, Any] = {"name": name, "metadata": metadata}
    if state in TERMINAL_BATCH_STATES:
        body["done"] = True
    if error is not None:
        body["error"] = dict(error)
    return body


def operation_resource(
    name: str,
    *,
    done: bool = False,
    response: Mapping[str, Any] | None = None,
    error_code: int | None = None,
    error_message: str = "",
    metadata: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """A google.longrunning.Operation (``done`` is omitted while false, as proto3 JSON does)."""
    body: dict[str, Any] = {"name": name}
    if metadata is not None:
        body["metadata"] = dict(metadata)
    if done:
        body["done"] = True
        if error_code is not None:
            body["error"] = {"code": error_code, "message": error_message}
        else:
            body["response"] = dict(response or {})
    return body


def video_response(uri: str) -> dict[str, Any]:
    """The ``response`` of a finished Veo operation on the Gemini API."""
    return {
        "@type": (
            "type.googleapis.com/google.ai.generativelanguage.v1beta.PredictLongRunningResponse"
        ),
        "generateVideoResponse": {"generatedSamples": [{"video": {"uri": uri}}]},
    }


def interaction_resource(
    interaction_id: str,
    status: str = "in_progress",
    *,
    updated: str | None = "2026-05-01T10:00:00Z",
    created: str | None = "2026-05-01T09:00:00Z",
    model: str = "gemini-2.5-flash",
) -> dict[str, Any]:
    body: dict[str, Any] = {"id": interaction_id, "status": status, "model": model}
    if created is not None:
        body["created"] = created
    if updated is not None:
        body["updated"] = updated
    return body


def webhook_resource(
    webhook_id: str,
    *,
    name: str | None = None,
    state: str = "enabled",
    uri: str = "https://example.invalid/gemini/webhook",
    subscribed_events: list[str] | None = None,
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "id": webhook_id,
        "uri": uri,
        "state": state,
        "subscribed_events": subscribed_events or ["batch.succeeded", "batch.failed"],
        "create_time": "2026-05-01T00:00:00Z",
        "update_time": "2026-05-01T00:00:00Z",
    }
    if name is not None:
        body["name"] = name
    return body


def error_body(status: int, message: str) -> dict[str, Any]:
    return {"error": {"code": status, "message": message, "status": STATUS_TEXT.get(status, "")}}


# --- the server ----------------------------------------------------------------------------------


class FakeGemini(FakeBatches):
    """The fake server; see the module docstring."""

    def __init__(self, *, request_delay: float = 0.0, host: str = "127.0.0.1") -> None:
        self.request_delay = request_delay
        self.host = host  # where it listens (the sam local tests: the Docker bridge's gateway)
        self.api_key: str | None = None
        self.requests: list[Request] = []
        self._reply_headers: dict[int, dict[str, str]] = {}
        self._state = _State()
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._init_submits()

    # lifecycle

    @property
    def base_url(self) -> str:
        if self._server is None:
            raise RuntimeError("the fake Gemini server is not started")
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def start(self) -> FakeGemini:
        fake = self

        class _Handler(_RequestHandler):
            owner = fake

        server = ThreadingHTTPServer((self.host, 0), _Handler)
        server.daemon_threads = True
        self._server = server
        self._stopping.clear()
        self._thread = threading.Thread(
            target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopping.set()  # cut every programmed delay short
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
        self._close_submits()

    def __enter__(self) -> FakeGemini:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # programming

    def put(self, name: str, body: Mapping[str, Any]) -> None:
        """Serve ``body`` (raw JSON) at resource ``name``."""
        with self._lock:
            self._state.resources[name] = dict(body)

    def remove(self, name: str) -> None:
        with self._lock:
            self._state.resources.pop(name, None)

    def resource(self, name: str) -> dict[str, Any] | None:
        with self._lock:
            body = self._state.resources.get(name)
            return None if body is None else dict(body)

    def put_batch(self, name: str, state: str = "BATCH_STATE_RUNNING", **kw: Any) -> None:
        self.put(name, batch_resource(name, state, **kw))

    def put_video(
        self,
        name: str,
        *,
        done: bool = False,
        video_uri: str | None = None,
        error_code: int | None = None,
        error_message: str = "",
        metadata: Mapping[str, Any] | None = None,
    ) -> None:
        response = video_response(video_uri) if video_uri is not None else None
        self.put(
            name,
            operation_resource(
                name,
                done=done,
                response=response,
                error_code=error_code,
                error_message=error_message,
                metadata=metadata,
            ),
        )

    def put_operation(self, name: str, **kw: Any) -> None:
        self.put(name, operation_resource(name, **kw))

    def put_interaction(self, name: str, status: str = "in_progress", **kw: Any) -> None:
        interaction_id = name.removeprefix("interactions/")
        self.put(
            f"interactions/{interaction_id}", interaction_resource(interaction_id, status, **kw)
        )

    def put_file(
        self,
        file_id: str,
        *,
        body: bytes | Callable[[], Iterator[bytes]] = b"",
        size: int | None = None,
        expiration_time: str | None = "2026-05-03T10:00:00Z",
        mime_type: str = "application/jsonl",
        content_encoding: str | None = None,
        declared_size: int | None = None,
        sha256_hash: str | None = None,
    ) -> str:
        """Serve a generated file at ``files/{id}`` and its bytes at ``:download``; returns
        the file's name. ``body`` is sent as is (with ``Content-Encoding: content_encoding``
        when given); the File resource's ``sizeBytes`` is ``declared_size`` when given (the
        decoded size of an encoded body, or a lie), else the body's size, and it carries
        ``sha256Hash`` when given."""
        name = f"files/{file_id.removeprefix('files/')}"
        if isinstance(body, bytes):
            data = body
            file_body = FileBody(
                len(data),
                lambda: iter([data[i : i + (1 << 20)] for i in range(0, len(data), 1 << 20)]),
            )
        else:
            if size is None:
                raise ValueError("a generated body needs its size")
            file_body = FileBody(size, body)
        file_body.encoding = content_encoding
        resource: dict[str, Any] = {
            "name": name,
            "mimeType": mime_type,
            "sizeBytes": str(file_body.size if declared_size is None else declared_size),
            "state": "ACTIVE",
            "source": "GENERATED",
            "downloadUri": f"{self.base_url}/v1beta/{name}:download?alt=media",
            "createTime": "2026-05-01T10:00:00Z",
        }
        if expiration_time is not None:
            resource["expirationTime"] = expiration_time
        if sha256_hash is not None:
            resource["sha256Hash"] = sha256_hash
        with self._lock:
            self._state.resources[name] = resource
            self._state.files[name] = file_body
        return name

    def expire_file(self, name: str) -> None:
        """Gemini deleted it: both routes answer 404 from now on."""
        with self._lock:
            self._state.resources.pop(name, None)
            self._state.files.pop(name, None)

    def cut(self, name: str, *, after: int, times: int | None = 1) -> None:
        """Close the connection of the next ``times`` downloads of ``name`` after ``after``
        bytes of the body (None: every one)."""
        with self._lock:
            self._state.cuts[name] = _Cut(after, times)

    def close_delimited(self, name: str) -> None:
        """Send the downloads of ``name`` without a Content-Length: the end of the body is the
        close of the connection, so a ``cut`` looks like the end to the client."""
        with self._lock:
            self._state.unsized.add(name)

    def slow_download(self, name: str, seconds_per_chunk: float) -> None:
        with self._lock:
            self._state.slow[name] = seconds_per_chunk

    def _download(self, request: Request) -> tuple[FileBody, int | None, float, bool] | None:
        """The body a ``:download`` request streams, where to cut it, how slowly and whether
        it is sized (a Content-Length) or ended by the close."""
        with self._lock:
            body = self._state.files.get(request.name)
            if body is None:
                return None
            cut = self._state.cuts.get(request.name)
            after = None
            if cut is not None:
                after = cut.after
                if cut.times is not None:
                    cut.times -= 1
                    if cut.times <= 0:
                        del self._state.cuts[request.name]
            slow = self._state.slow.get(request.name, 0.0)
            return body, after, slow, request.name not in self._state.unsized

    def put_webhook(self, webhook_id: str, **kw: Any) -> None:
        self.put(f"webhooks/{webhook_id}", webhook_resource(webhook_id, **kw))

    def fail(
        self,
        name: str,
        status: int,
        *,
        times: int | None = None,
        message: str = "",
        retry_after: str | None = None,
    ) -> None:
        """Answer ``status`` for the next ``times`` requests naming ``name`` (None: always),
        with a ``Retry-After: <retry_after>`` header when given."""
        with self._lock:
            self._state.faults[name] = _Fault(
                status, times, message or f"fake {status}", retry_after
            )

    def clear_fault(self, name: str) -> None:
        with self._lock:
            self._state.faults.pop(name, None)

    def delay(self, name: str, seconds: float) -> None:
        """Answer requests naming ``name`` only after ``seconds`` (0 removes the delay)."""
        with self._lock:
            if seconds > 0:
                self._state.delays[name] = seconds
            else:
                self._state.delays.pop(name, None)

    def on_request(self, name: str, hook: Callable[[Request], None] | None) -> None:
        """Run ``hook(request)`` when a request naming ``name`` arrives (before any answer)."""
        with self._lock:
            if hook is None:
                self._state.hooks.pop(name, None)
            else:
                self._state.hooks[name] = hook

    def route(self, method: str, pattern: str, handler: Handler) -> None:
        """Answer ``method`` requests whose resource name fully matches ``pattern`` with
        ``handler(request) -> (status, json body)``; checked before the built-in routes."""
        with self._lock:
            self._state.routes.append((method.upper(), re.compile(pattern), handler))

    def endless_listing(self, mode: str | None) -> None:
        """Make the batch listing endless: every page holds every batch again and a next-page
        token, the same one each time (``"repeat"``) or a new one each time (``"fresh"``);
        None: the ordinary listing."""
        if mode not in (None, "repeat", "fresh"):
            raise ValueError(f"mode is 'repeat', 'fresh' or None, not {mode!r}")
        with self._lock:
            self._state.endless = mode

    def hits(self, name: str) -> int:
        with self._lock:
            return sum(1 for r in self.requests if r.name == name)

    def reset_requests(self) -> None:
        with self._lock:
            self.requests.clear()

    # answering

    def _answer(self, request: Request) -> Response:
        self._arrive(request)
        session = request.path.startswith("/upload/") and "upload_id" in request.query
        if (
            self.api_key is not None
            and not session  # an upload session's URL is its credential
            and request.headers.get("x-goog-api-key") != self.api_key
        ):
            return 401, error_body(401, "API key not valid")
        with self._lock:
            faulted = self._take_fault(request)
            handler = self._route_for(request) if faulted is None else None
        if faulted is not None:
            return faulted
        if handler is not None:
            return handler(request)
        return self._builtin(request)

    def _arrive(self, request: Request) -> None:
        """Record ``request``, wait out its delay and run its hook."""
        with self._lock:
            self.requests.append(request)
            hook = self._state.hooks.get(request.name)
            delay = self.request_delay + self._state.delays.get(request.name, 0.0)
        if delay > 0:
            self._stopping.wait(delay)
        if hook is not None:
            hook(request)

    def _take_fault(self, request: Request) -> Response | None:
        """The injected error for ``request``, counting it down (hold the lock)."""
        fault = self._state.faults.get(request.name)
        if fault is None:
            return None
        if fault.times is not None:
            fault.times -= 1
            if fault.times <= 0:
                del self._state.faults[request.name]
        if fault.retry_after is not None:
            self._reply_headers[id(request)] = {"Retry-After": fault.retry_after}
        return fault.status, error_body(fault.status, fault.message)

    def _route_for(self, request: Request) -> Handler | None:
        """The first added route matching ``request`` (hold the lock)."""
        return next(
            (
                route_handler
                for method, pattern, route_handler in self._state.routes
                if method == request.method and pattern.fullmatch(request.name)
            ),
            None,
        )

    def _builtin(self, request: Request) -> Response:
        """The built-in routes: GET a resource, list batches or webhooks, download a file;
        upload, create and cancel (``fake_gemini_batches``)."""
        submitted = self._submit_answer(request)
        if submitted is not None:
            return submitted
        if request.method == "GET" and request.verb == "download":
            download = self._download(request)
            if download is None:
                return 404, error_body(404, f"{request.name} not found")
            return 200, download
        if request.method != "GET" or request.verb is not None:
            return 404, error_body(404, f"no fake route for {request.method} {request.path}")
        if request.name == "batches":
            return 200, self._list("batches/", request, "pageSize", "pageToken", "operations")
        if request.name == "webhooks":
            return 200, self._list("webhooks/", request, "page_size", "page_token", "webhooks")
        body = self.resource(request.name)
        if body is None:
            return 404, error_body(404, f"{request.name} not found")
        return 200, body

    def _list(
        self, prefix: str, request: Request, size_key: str, token_key: str, items_key: str
    ) -> dict[str, Any]:
        with self._lock:
            items = [
                dict(body)
                for name, body in sorted(self._state.resources.items())
                if name.startswith(prefix) and "/" not in name[len(prefix) :]
            ]
        size = int((request.query.get(size_key) or [str(DEFAULT_PAGE_SIZE)])[0])
        start = int((request.query.get(token_key) or ["0"])[0] or 0)
        page = items[start : start + size]
        body: dict[str, Any] = {items_key: page}
        endless = self._state.endless if prefix == "batches/" else None
        if endless is not None:
            body[items_key] = items[:size]
            body["nextPageToken"] = "1" if endless == "repeat" else str(start + size)
        elif start + size < len(items):
            next_key = "nextPageToken" if token_key == "pageToken" else "next_page_token"
            body[next_key] = str(start + size)
        return body


def parse_path(raw_path: str) -> tuple[str, str | None, str | None]:
    """(resource name, ":verb" suffix, API version) of a request path."""
    segments = [s for s in raw_path.split("/") if s]
    version = None
    if segments and API_VERSION.fullmatch(segments[0]):
        version = segments.pop(0)
    verb = None
    if segments and ":" in segments[-1]:
        segments[-1], verb = segments[-1].split(":", 1)
    return "/".join(segments), verb, version


class _RequestHandler(BaseHTTPRequestHandler):
    owner: FakeGemini
    protocol_version = "HTTP/1.1"  # keep-alive: the SDK's connection pool is reused
    timeout = 10  # an idle keep-alive connection frees its thread after this
    disable_nagle_algorithm = True  # headers and body are two writes: no 40 ms delayed-ACK stall

    def _handle(self) -> None:
        parts = urlsplit(self.path)
        length = int(self.headers.get("Content-Length") or 0)
        body: Any = None
        if parts.path.startswith("/upload/") and "upload_id=" in parts.query:
            body = BodyStream(self.rfile, length)  # an upload chunk: read by its route
        else:
            raw = self.rfile.read(length) if length else b""
            try:
                body = json.loads(raw) if raw else None
            except ValueError:
                body = raw.decode("utf-8", "replace")
        name, verb, version = parse_path(parts.path)
        request = Request(
            method=self.command,
            path=parts.path,
            name=name,
            verb=verb,
            api_version=version,
            query=parse_qs(parts.query),
            headers={k.lower(): v for k, v in self.headers.items()},
            body=body,
        )
        try:
            status, payload = self.owner._answer(request)
        except DropConnection:
            self.close_connection = True  # the answer is lost
            return
        finally:
            if isinstance(body, BodyStream):
                body.drain()
        with self.owner._lock:
            extra = self.owner._reply_headers.pop(id(request), {})
        if isinstance(payload, tuple):
            self._stream(*payload)
            return
        data = b"" if payload is None else json.dumps(payload).encode()
        try:
            self.send_response(status)
            for key, value in extra.items():
                self.send_header(key, value)
            self.send_header("Content-Type", "application/json; charset=UTF-8")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):  # the client timed out and left
            self.close_connection = True

    def _stream(self, body: FileBody, cut_after: int | None, delay: float, sized: bool) -> None:
        """Send a file's bytes as they are generated; cut the connection after ``cut_after``
        bytes (the client sees a body shorter than its Content-Length, or, not ``sized``, a
        body that simply ended)."""
        try:
            self.send_response(200)
            self.send_header("Content-Type", "application/octet-stream")
            if body.encoding is not None:
                self.send_header("Content-Encoding", body.encoding)
            if sized:
                self.send_header("Content-Length", str(body.size))
            else:
                self.send_header("Connection", "close")
                self.close_connection = True
            self.end_headers()
            sent = 0
            for chunk in body.chunks():
                if cut_after is not None and sent + len(chunk) > cut_after:
                    self.wfile.write(chunk[: max(0, cut_after - sent)])
                    self.wfile.flush()
                    self.close_connection = True
                    self.connection.shutdown(2)
                    return
                self.wfile.write(chunk)
                sent += len(chunk)
                if delay > 0:
                    self.owner._stopping.wait(delay)
        except (BrokenPipeError, ConnectionResetError, OSError):
            self.close_connection = True

    do_GET = _handle
    do_POST = _handle
    do_PATCH = _handle
    do_DELETE = _handle
    do_PUT = _handle

    def log_message(self, format: str, *args: Any) -> None:
        return None
