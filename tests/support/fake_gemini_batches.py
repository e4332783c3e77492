"""The fake Gemini's submitting side: the Files API's resumable upload, batch create and cancel
(mixed into ``FakeGemini``; see ``tests/support/fake_gemini.py`` for the reading side).

The shapes are google-genai 3.6.1's (``files.upload`` -> ``_api_client.upload_file``,
``batches.create`` -> ``_CreateBatchJobParameters_to_mldev``, ``batches.cancel``):

==========================================  ================================================
``POST /upload/v1beta/files``               start: headers ``X-Goog-Upload-Protocol:
                                            resumable``, ``X-Goog-Upload-Command: start``,
                                            ``X-Goog-Upload-Header-Content-Length`` and
                                            ``-Content-Type``; body ``{"file": {"mimeType",
                                            "displayName", "sizeBytes"}}``; answers 200 with
                                            ``x-goog-upload-url`` (back to this fake)
``POST <upload url>``                       ``X-Goog-Upload-Command: upload`` or ``upload,
                                            finalize`` at ``X-Goog-Upload-Offset``; answers
                                            ``x-goog-upload-status: active`` or ``final``
                                            with ``{"file": {...}}`` (source ``UPLOADED``);
                                            a chunk before the last must be a multiple of
                                            256 KiB; bodies go to disk, never held whole
``GET  files/{id}:download`` (uploaded)     400: only generated files can be downloaded
``POST models/{m}:batchGenerateContent``    body ``{"batch": {"displayName", "inputConfig":
                                            {"fileName"}}}``: a new ``batches/<id>`` in
                                            ``BATCH_STATE_PENDING`` (the LRO shape)
``POST batches/{id}:cancel``                ``BATCH_STATE_CANCELLED`` unless terminal; ``{}``
==========================================  ================================================

Test helpers::

    fake.uploaded("files/x") -> bytes           # what an upload stored
    fake.batches_created() -> ["batches/..."]   # in creation order
    fake.batch_input("batches/x") -> bytes      # the uploaded input of a created batch
    fake.run_batch("batches/x", [{"key": "a", "response": {...}}, ...])  # or JSONL bytes;
        # a generated output file, metadata.output.responsesFile, batchStats, the state
    fake.set_batch_state("batches/x", "BATCH_STATE_EXPIRED")
    fake.fail_create(429, "quota exceeded", times=1)   # refuse the next creates
    fake.on_create(fn)     # fn(name) after the batch exists, before the answer; if fn raises,
                           # the connection closes unanswered (a create whose answer is lost)
    fake.clock = lambda: 1_777_000_000.0        # the seconds createTime/updateTime are read from
    fake.limits = QueueLimits(enqueued_tokens={"gemini-2.5-flash": 3_000_000}, max_open=100)
        # the Batch API's limits (tests/support/fake_gemini_limits.py); None: none
"""

from __future__ import annotations

import base64
import hashlib
import json
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import IO, TYPE_CHECKING, Any, Protocol

from tests.support.fake_gemini_limits import QueueLimits

if TYPE_CHECKING:
    from tests.support.fake_gemini import Request, Response

# The resumable protocol's granularity: every chunk but the last is a multiple of it.
UPLOAD_GRANULARITY = 256 * 1024
# How long Gemini keeps an uploaded file.
FILE_TTL_S = 48 * 3600
_READ_PIECE = 64 * 1024
BATCH_TYPE = "type.googleapis.com/google.ai.generativelanguage.v1main.GenerateContentBatch"
_TERMINAL = frozenset(
    {"BATCH_STATE_SUCCEEDED", "BATCH_STATE_FAILED", "BATCH_STATE_CANCELLED", "BATCH_STATE_EXPIRED"}
)


class Incoming(Protocol):
    """A request body the handler has not read yet (an upload chunk)."""

    def read(self, size: int) -> bytes: ...


class DropConnection(Exception):
    """Answer nothing: the handler closes the connection (a lost answer)."""


@dataclass
class BodyStream:
    """The unread body of a request: ``length`` bytes of ``source``; ``drain`` reads what the
    route left so that the keep-alive connection stays in step."""

    source: Incoming
    length: int
    left: int = field(init=False)

    def __post_init__(self) -> None:
        self.left = self.length

    def read(self, size: int = _READ_PIECE) -> bytes:
        if self.left <= 0:
            return b""
        data = self.source.read(min(size, self.left))
        self.left -= len(data)
        if not data:
            self.left = 0
        return data

    def drain(self) -> None:
        while self.read():
            pass


@dataclass
class _Upload:
    size: int
    mime_type: str
    display_name: str | None
    spool: IO[bytes]
    received: int = 0
    name: str | None = None
    digest: Any = field(default_factory=hashlib.sha256)


@dataclass
class _Refusal:
    status: int
    message: str
    times: int | None
    body: dict[str, Any] | None = None  # the whole error body Gemini answers, when given


@dataclass
class _Submits:
    uploads: dict[str, _Upload] = field(default_factory=dict)  # upload id -> session
    files: dict[str, IO[bytes]] = field(default_factory=dict)  # files/<id> -> stored bytes
    created: list[str] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)  # files/<id> deleted (files.delete)
    inputs: dict[str, str] = field(default_factory=dict)  # batches/<id> -> files/<id>
    refusal: _Refusal | None = None
    on_create: Callable[[str], None] | None = None
    count: int = 0
    last_s: float = 0.0


def _rfc3339(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _error(status: int, message: str) -> dict[str, Any]:
    from tests.support.fake_gemini import error_body

    return error_body(status, message)


class FakeBatches:
    """The submitting routes and their test helpers (state guarded by ``FakeGemini._lock``)."""

    _lock: threading.Lock
    _reply_headers: dict[int, dict[str, str]]
    clock: Callable[[], float]

    if TYPE_CHECKING:  # FakeGemini's

        @property
        def base_url(self) -> str: ...
        def put(self, name: str, body: Mapping[str, Any]) -> None: ...
        def resource(self, name: str) -> dict[str, Any] | None: ...
        def remove(self, name: str) -> None: ...
        def put_file(self, file_id: str, *, body: bytes = ...) -> str: ...

    def _init_submits(self) -> None:
        self._submits = _Submits()
        self.clock = time.time
        self.limits: QueueLimits | None = None

    def _close_submits(self) -> None:
        with self._lock:
            for upload in self._submits.uploads.values():
                upload.spool.close()
            for spool in self._submits.files.values():
                spool.close()
            self._submits = _Submits()

    # --- helpers ---------------------------------------------------------------------------

    def uploaded(self, name: str) -> bytes:
        """The bytes an upload stored as file ``name``."""
        with self._lock:
            spool = self._submits.files[name]
            spool.seek(0)
            return spool.read()

    def files_held(self) -> list[str]:
        """The uploaded files Gemini still holds (uploaded, not deleted), in upload order."""
        with self._lock:
            return [n for n in self._submits.files if n not in self._submits.deleted]

    def files_deleted(self) -> list[str]:
        with self._lock:
            return list(self._submits.deleted)

    def batches_created(self) -> list[str]:
        with self._lock:
            return list(self._submits.created)

    def batch_input(self, name: str) -> bytes:
        """The uploaded input of created batch ``name``."""
        with self._lock:
            file_name = self._submits.inputs[name]
        return self.uploaded(file_name)

    def fail_create(
        self,
        status: int,
        message: str = "",
        *,
        times: int | None = 1,
        body: dict[str, Any] | None = None,
    ) -> None:
        """Refuse the next ``times`` creates (None: every one) with ``status`` and ``body``
        (a real error body, ``{"error": {...}}``), or a body of ``message``."""
        with self._lock:
            self._submits.refusal = _Refusal(status, message or f"fake {status}", times, body)

    def on_create(self, hook: Callable[[str], None] | None) -> None:
        with self._lock:
            self._submits.on_create = hook

    def set_batch_state(self, name: str, state: str) -> None:
        self._update_batch(name, state)

    def run_batch(
        self,
        name: str,
        lines: list[dict[str, Any]] | bytes,
        state: str = "BATCH_STATE_SUCCEEDED",
    ) -> str:
        """Finish batch ``name`` with ``lines`` (output rows, or JSONL bytes) as its generated
        output file; sets ``metadata.output.responsesFile``, ``batchStats`` and ``state``.
        Returns the output file's name."""
        if isinstance(lines, bytes):
            data = lines
            rows = [json.loads(line) for line in data.splitlines() if line.strip()]
        else:
            rows = lines
            data = b"".join(json.dumps(row).encode() + b"\n" for row in rows)
        answered = sum(1 for row in rows if isinstance(row, Mapping) and "response" in row)
        file_id = f"{name.removeprefix('batches/')}-output"
        output = self.put_file(file_id, body=data)
        stats = {
            "requestCount": str(len(rows)),
            "successfulRequestCount": str(answered),
            "failedRequestCount": str(len(rows) - answered),
            "pendingRequestCount": "0",
        }
        self._update_batch(name, state, output={"responsesFile": output}, batchStats=stats)
        return output

    def _now(self) -> str:
        """The clock's time, strictly later than the last one given (updateTime grows)."""
        with self._lock:
            now = max(self.clock(), self._submits.last_s + 1e-6)
            self._submits.last_s = now
        return _rfc3339(now)

    def _update_batch(self, name: str, state: str, **metadata: Any) -> None:
        if not state.startswith("BATCH_STATE_"):
            state = f"BATCH_STATE_{state}"
        body = self.resource(name)
        if body is None:
            raise KeyError(name)
        meta = dict(body.get("metadata") or {})
        meta.update(metadata)
        meta["state"] = state
        meta["updateTime"] = self._now()
        if state in _TERMINAL:
            meta.setdefault("endTime", meta["updateTime"])
            body["done"] = True
        body["metadata"] = meta
        self.put(name, body)

    # --- routes ----------------------------------------------------------------------------

    def _submit_answer(self, request: Request) -> Response | None:
        """The submitting routes' answer to ``request``, None when it is not theirs."""
        if request.method == "DELETE" and request.name.startswith("files/"):
            return self._delete_file(request)
        if request.method != "POST":
            if request.method == "GET" and request.verb == "download":
                with self._lock:
                    uploaded = request.name in self._submits.files
                if uploaded:
                    return 400, _error(
                        400, f"Only generated files can be downloaded; {request.name} was uploaded"
                    )
            return None
        if request.path.startswith("/upload/"):
            return self._upload(request)
        if request.verb == "batchGenerateContent" and request.name.startswith("models/"):
            return self._create(request)
        if request.verb == "cancel" and request.name.startswith("batches/"):
            return self._cancel(request)
        return None

    def _upload(self, request: Request) -> Response:
        command = request.headers.get("x-goog-upload-command", "")
        if command == "start":
            return self._upload_start(request)
        upload_id = (request.query.get("upload_id") or [""])[0]
        with self._lock:
            upload = self._submits.uploads.get(upload_id)
        if upload is None or not isinstance(request.body, BodyStream):
            return self._upload_reply(request, 404, _error(404, "no such upload session"))
        return self._upload_chunk(request, upload, command)

    def _upload_start(self, request: Request) -> Response:
        file = request.body.get("file") if isinstance(request.body, Mapping) else None
        file = file if isinstance(file, Mapping) else {}
        try:
            size = int(request.headers.get("x-goog-upload-header-content-length", ""))
        except ValueError:
            return 400, _error(400, "X-Goog-Upload-Header-Content-Length is required")
        if self.limits is not None and not self.limits.upload_size(size):
            return 400, _error(400, f"the fake's limit: a file of {size} bytes is too large")
        mime = request.headers.get("x-goog-upload-header-content-type") or file.get(
            "mimeType", file.get("mime_type")
        )
        with self._lock:
            self._submits.count += 1
            upload_id = f"up{self._submits.count}"
            self._submits.uploads[upload_id] = _Upload(
                size=size,
                mime_type=str(mime or "application/octet-stream"),
                # google-genai 3.6.1 sends the File's fields in snake_case here
                display_name=file.get("displayName", file.get("display_name")),
                spool=tempfile.TemporaryFile(),  # noqa: SIM115 - closed by _close_submits
            )
            self._reply_headers[id(request)] = {
                "x-goog-upload-url": (
                    f"{self.base_url}{request.path}?upload_id={upload_id}&upload_protocol=resumable"
                ),
                "x-goog-upload-status": "active",
            }
        return 200, None

    def _upload_reply(
        self, request: Request, status: int, body: Any, state: str = "final"
    ) -> Response:
        with self._lock:
            self._reply_headers[id(request)] = {"x-goog-upload-status": state}
        return status, body

    def _upload_chunk(self, request: Request, upload: _Upload, command: str) -> Response:
        assert isinstance(request.body, BodyStream)
        words = {word.strip() for word in command.split(",")}
        offset = request.headers.get("x-goog-upload-offset", "")
        if "upload" not in words or not offset.isdigit() or int(offset) != upload.received:
            return self._upload_reply(
                request, 400, _error(400, f"bad upload command {command!r} at offset {offset!r}")
            )
        length = request.body.length
        final = "finalize" in words
        if not final and length % UPLOAD_GRANULARITY:
            return self._upload_reply(
                request, 400, _error(400, f"a chunk of {length} bytes is not a multiple of 256 KiB")
            )
        while piece := request.body.read(_READ_PIECE):
            upload.spool.write(piece)
            upload.digest.update(piece)
            upload.received += len(piece)
        if upload.received > upload.size or (final and upload.received != upload.size):
            return self._upload_reply(
                request, 400, _error(400, f"{upload.received} bytes sent, {upload.size} declared")
            )
        if not final:
            return self._upload_reply(request, 200, None, state="active")
        return self._upload_reply(request, 200, {"file": self._store_upload(upload)})

    def _store_upload(self, upload: _Upload) -> dict[str, Any]:
        now = self._now()
        with self._lock:
            self._submits.count += 1
            name = f"files/uploaded-{self._submits.count}"
            upload.name = name
            self._submits.files[name] = upload.spool
        created = datetime.strptime(now, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=UTC)
        resource: dict[str, Any] = {
            "name": name,
            "mimeType": upload.mime_type,
            "sizeBytes": str(upload.received),
            "createTime": now,
            "updateTime": now,
            "expirationTime": _rfc3339(created.timestamp() + FILE_TTL_S),
            "sha256Hash": base64.b64encode(upload.digest.hexdigest().encode()).decode(),
            "uri": f"{self.base_url}/v1beta/{name}",
            "state": "ACTIVE",
            "source": "UPLOADED",
        }
        if upload.display_name is not None:
            resource["displayName"] = upload.display_name
        self.put(name, resource)
        return resource

    def _create(self, request: Request) -> Response:
        with self._lock:
            refusal = self._submits.refusal
            if refusal is not None and refusal.times is not None:
                refusal.times -= 1
                if refusal.times <= 0:
                    self._submits.refusal = None
            hook = self._submits.on_create
        if refusal is not None:
            return refusal.status, refusal.body or _error(refusal.status, refusal.message)
        batch = request.body.get("batch") if isinstance(request.body, Mapping) else None
        batch = batch if isinstance(batch, Mapping) else {}
        source = batch.get("inputConfig")
        file_name = source.get("fileName") if isinstance(source, Mapping) else None
        display = batch.get("displayName")
        if not isinstance(display, str) or not display:
            return 400, _error(400, "batch.display_name is required")
        with self._lock:
            known = file_name in self._submits.files
        if not known:
            return 400, _error(400, f"input file {file_name!r} does not exist")
        with self._lock:
            self._submits.count += 1
            name = f"batches/created-{self._submits.count}"
        if self.limits is not None:
            data = self.uploaded(str(file_name))
            refused = self.limits.admit(name, request.name, data, self._active)
            if refused is not None:
                return 429, refused
        now = self._now()
        with self._lock:
            self._submits.created.append(name)
            self._submits.inputs[name] = str(file_name)
        body: dict[str, Any] = {
            "name": name,
            "metadata": {
                "@type": BATCH_TYPE,
                "name": name,
                "model": request.name,
                "displayName": display,
                "inputConfig": {"fileName": file_name},
                "state": "BATCH_STATE_PENDING",
                "createTime": now,
                "updateTime": now,
            },
        }
        self.put(name, body)
        if hook is not None:
            try:
                hook(name)
            except Exception as exc:
                raise DropConnection(str(exc)) from exc
        return 200, body

    def _active(self, name: str) -> bool:
        body = self.resource(name)
        return body is not None and (body.get("metadata") or {}).get("state") not in _TERMINAL

    def _delete_file(self, request: Request) -> Response:
        """``files.delete``: DELETE /v1beta/files/<id> answers 200 with an empty body; the
        file's resource answers 404 from then on (its bytes stay readable to the test:
        ``uploaded``). Real: https://ai.google.dev/api/rest/v1beta/files/delete: "DELETE
        https://generativelanguage.googleapis.com/v1beta/{name=files/*}" ... "The request
        body must be empty." ... "If successful, the response body is empty." """
        with self._lock:
            held = request.name in self._submits.files and request.name not in self._submits.deleted
            if held:
                self._submits.deleted.append(request.name)
        if not held:
            return 404, _error(404, f"{request.name} not found")
        self.remove(request.name)
        return 200, None

    def _cancel(self, request: Request) -> Response:
        body = self.resource(request.name)
        if body is None:
            return 404, _error(404, f"{request.name} not found")
        state = (body.get("metadata") or {}).get("state")
        if state not in _TERMINAL:
            self._update_batch(request.name, "BATCH_STATE_CANCELLED")
        return 200, {}
