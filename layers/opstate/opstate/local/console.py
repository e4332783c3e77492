"""The operations page of ``opstate serve``: ``/`` in a browser.

A WSGI layer in front of the API app: it answers the page (plain HTML/CSS/JS shipped in
``opstate/local/static``, no build step, nothing fetched from elsewhere), two JSON endpoints the
page polls, and hands every other request to the API unchanged.

- ``GET /`` and ``GET /ui/static/<file>``: the page. It holds no data, so it needs no token; the
  token reaches the page in the URL's fragment (``/#token=...``, never sent to a server or
  written to a log), is kept in the tab's ``sessionStorage`` and sent as
  ``Authorization: Bearer`` on every data request.
- ``GET /ui/api/operations[?since=<cursor>]``: every record (without details), newest activity
  first, at most ``max_operations``; with ``since`` equal to the current cursor (the number of
  decisions this server has taken) only ``{"changed": false}``, without reading the store.
- ``GET /ui/api/operation?name=<name>``: one record with its details and the decisions this
  server has taken for it (``DecisionLog``: applied and dropped, with reasons); a record with a
  retry state (docs/retry.md) adds its lineage and its root's retry view to the record (as the
  API's GET does) and, for a root, ``final`` (``domain.retry.final_view``); a job (docs/jobs.md)
  adds ``parts`` (``_job_parts``: each part's phase, rows, tokens and batch). Found as the API
  finds it (``ingest.find_named``): a record an earlier release keyed otherwise (a video by its
  full name, a Google Cloud job with its location as written) is found too; so is the one
  ``refresh`` polls.
- ``POST /ui/api/refresh?name=<name>``: poll that operation at Gemini now (``refresh``: the
  reconciler's ``refresh_one``, wired by serve when a Gemini API key is set; 409 otherwise).
- ``GET /ui/api/token-help``: where the token is (``token_help``: the token file's path or the
  variable's name) and whether refresh is available. No data, so no token: the page shows it
  when it asks for the token.

The other endpoints require what the operations routes require: ``authorized(headers)`` is the
one check (the serve wiring passes ``opstate.api_token.bearer_token_ok`` with the API token).
Answers are ``no-store`` and the page is served with a strict Content-Security-Policy (same
origin only, no inline script).
"""

from __future__ import annotations

import json
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable, Mapping
from importlib import resources
from typing import Any
from urllib.parse import parse_qs

from opstate.domain.model import OpRecord
from opstate.domain.names import InvalidNameError, parse_name
from opstate.domain.times import format_time
from opstate.domain.views import record_to_json
from opstate.ingest import find_named
from opstate.outcomes.results import record_outcome, results_json
from opstate.reconcile.tally import MarkDecision, RunDecision
from opstate.store.port import RetryableError, RetryingStore, Store

StartResponse = Callable[..., Any]
WsgiApp = Callable[[dict[str, Any], StartResponse], Iterable[bytes]]
Authorizer = Callable[[Mapping[str, str]], bool]
# Polls one operation now: (HTTP status, JSON body). Raises RetryableError on a store fault.
Refresher = Callable[[str], tuple[int, dict[str, Any]]]

PAGE_PATH = "/"
STATIC_PREFIX = "/ui/static/"
OPERATIONS_PATH = "/ui/api/operations"
OPERATION_PATH = "/ui/api/operation"
REFRESH_PATH = "/ui/api/refresh"
TOKEN_HELP_PATH = "/ui/api/token-help"
STATIC_FILES = {
    "console.css": "text/css; charset=utf-8",
    "console.js": "text/javascript; charset=utf-8",
    "favicon.svg": "image/svg+xml",
}
DEFAULT_MAX_OPERATIONS = 5000
# The most parts a job's view lists (a plan holds at most 400: ``opstate.retry.jobs``).
MAX_JOB_PARTS = 400
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
    "img-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
)
_COMMON_HEADERS = [
    ("Cache-Control", "no-store"),
    ("X-Content-Type-Options", "nosniff"),
    ("Referrer-Policy", "no-referrer"),
]


class DecisionLog:
    """The decisions this server has taken, per operation, bounded in memory.

    At most ``per_operation`` entries are kept per operation (the newest) and at most
    ``max_operations`` operations (the least recently decided are forgotten first). ``cursor``
    counts every decision ever added: the page's cheap "anything new?" check. Thread-safe.
    """

    def __init__(
        self,
        *,
        per_operation: int = 100,
        max_operations: int = 10_000,
        clock_ns: Callable[[], int] = time.time_ns,
    ) -> None:
        if per_operation < 1 or max_operations < 1:
            raise ValueError("the decision log bounds must be at least 1")
        self._per_operation = per_operation
        self._max_operations = max_operations
        self._clock_ns = clock_ns
        self._lock = threading.Lock()
        self._by_name: OrderedDict[str, deque[dict[str, Any]]] = OrderedDict()
        self._cursor = 0

    @property
    def cursor(self) -> int:
        with self._lock:
            return self._cursor

    def add(self, decision: RunDecision) -> None:
        """Keep one decision: the API's and the reconciler's (a lost / overdue mark is kept as
        a decision that changed no state, its reason the mark)."""
        entry = self._entry(decision)
        name = decision.record.name if isinstance(decision, MarkDecision) else decision.event.name
        with self._lock:
            self._cursor += 1
            entry["seq"] = self._cursor
            entries = self._by_name.pop(name, None)
            if entries is None:
                entries = deque(maxlen=self._per_operation)
            entries.append(entry)
            self._by_name[name] = entries
            while len(self._by_name) > self._max_operations:
                self._by_name.popitem(last=False)

    def _entry(self, decision: RunDecision) -> dict[str, Any]:
        now = format_time(self._clock_ns())
        if isinstance(decision, MarkDecision):
            marked = decision.record
            return {
                "receivedAt": now,
                "applied": False,
                "reason": str(decision.mark),
                "state": str(marked.state),
                "storedState": str(marked.state),
                "version": marked.version,
                "source": "poll",
                "updateTime": format_time(marked.update_time_ns) if marked.update_time_ns else None,
            }
        event = decision.event
        record = decision.record
        return {
            "receivedAt": now,
            "applied": decision.applied,
            "reason": str(decision.reason),
            "state": str(event.state),
            "storedState": str(record.state) if record is not None else None,
            "version": record.version if record is not None else 0,
            "source": str(event.source),
            "updateTime": format_time(event.update_time_ns) if event.update_time_ns else None,
        }

    def for_operation(self, name: str) -> list[dict[str, Any]]:
        """The kept decisions for ``name``, oldest first."""
        with self._lock:
            return [dict(e) for e in self._by_name.get(name, ())]


def _static(name: str) -> bytes:
    return resources.files("opstate.local").joinpath("static").joinpath(name).read_bytes()


def _headers(environ: Mapping[str, Any]) -> dict[str, str]:
    out = {
        key[5:].replace("_", "-").lower(): str(value)
        for key, value in environ.items()
        if key.startswith("HTTP_")
    }
    return out


def _summary(record: OpRecord) -> dict[str, Any]:
    view = record_to_json(record)
    view.pop("details", None)
    view["terminal"] = record.terminal
    return view


class Console:
    """The page and its data endpoints in front of ``inner`` (the API's WSGI app)."""

    def __init__(
        self,
        inner: WsgiApp,
        *,
        store: Store,
        decisions: DecisionLog,
        authorized: Authorizer,
        clock_ns: Callable[[], int] = time.time_ns,
        max_operations: int = DEFAULT_MAX_OPERATIONS,
        token_help: Mapping[str, Any] | None = None,
        refresh: Refresher | None = None,
    ) -> None:
        self._inner = inner
        self._token_help = {**(token_help or {}), "refresh": refresh is not None}
        self._refresh = refresh
        self._store = store
        self._decisions = decisions
        self._authorized = authorized
        self._clock_ns = clock_ns
        self._max_operations = max_operations

    def __call__(self, environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        path = str(environ.get("PATH_INFO") or "/")
        method = str(environ.get("REQUEST_METHOD", "GET"))
        if path == PAGE_PATH or path.startswith("/ui/"):
            allowed = ("POST",) if path == REFRESH_PATH else ("GET", "HEAD")
            if method not in allowed:
                return self._json(start_response, 405, _error("method-not-allowed", method))
            status, headers, body = self._answer(environ, path)
            start_response(_status(status), [*headers, ("Content-Length", str(len(body)))])
            return [b"" if method == "HEAD" else body]
        return self._inner(environ, start_response)

    # --- routing ----------------------------------------------------------------------------

    def _answer(
        self, environ: Mapping[str, Any], path: str
    ) -> tuple[int, list[tuple[str, str]], bytes]:
        if path == PAGE_PATH:
            return self._file("index.html", "text/html; charset=utf-8")
        if path.startswith(STATIC_PREFIX):
            name = path[len(STATIC_PREFIX) :]
            content_type = STATIC_FILES.get(name)
            if content_type is None:
                return self._data(404, _error("not-found", f"no page file {name!r}"))
            return self._file(name, content_type)
        if path == TOKEN_HELP_PATH:
            return self._data(200, self._token_help)
        if path not in (OPERATIONS_PATH, OPERATION_PATH, REFRESH_PATH):
            return self._data(404, _error("not-found", f"no page route {path}"))
        if not self._authorized(_headers(environ)):
            status, headers, body = self._data(
                401,
                _error(
                    "unauthorized",
                    "this route requires 'Authorization: Bearer <token>' (the opstate API token)",
                ),
            )
            return status, [*headers, ("WWW-Authenticate", 'Bearer realm="opstate"')], body
        query = parse_qs(str(environ.get("QUERY_STRING") or ""))
        try:
            if path == OPERATIONS_PATH:
                return self._data(200, self._operations(query.get("since", [""])[0]))
            if path == REFRESH_PATH:
                return self._refresh_one(query.get("name", [""])[0])
            return self._operation(query.get("name", [""])[0])
        except RetryableError:
            return self._data(503, _error("unavailable", "the store is unavailable; retry later"))

    def _operations(self, since: str) -> dict[str, Any]:
        now = format_time(self._clock_ns())
        cursor = self._decisions.cursor
        if since and since == str(cursor):
            return {"now": now, "cursor": str(cursor), "changed": False}
        records = sorted(
            self._store.iter_all(),
            key=lambda r: (r.applied_ns or r.created_ns, r.name),
            reverse=True,
        )
        shown = records[: self._max_operations]
        return {
            "now": now,
            "cursor": str(cursor),
            "changed": True,
            "total": len(records),
            "operations": [_summary(r) for r in shown],
        }

    def _find(self, raw_name: str) -> tuple[str, OpRecord | None]:
        """The canonical key of ``raw_name`` and its record, as the API and the CLI find it: a
        video operation an earlier release keyed by its full name, and a Google Cloud job keyed
        with its location as written (``ParsedName.legacy``), are found too; the record keeps
        its own key. An invalid name raises ``InvalidNameError``."""
        parsed = parse_name(raw_name)
        return parsed.key, find_named(self._store, parsed)

    def _operation(self, raw_name: str) -> tuple[int, list[tuple[str, str]], bytes]:
        try:
            name, record = self._find(raw_name)
        except InvalidNameError as exc:
            return self._data(400, _error("invalid-name", str(exc)))
        if record is not None:
            name = record.name  # an older key: its decisions and results are filed under it
        decisions = self._decisions.for_operation(name)
        if record is None and not decisions:
            return self._data(404, _error("not-found", f"no operation named {name!r} is tracked"))
        view = None
        results = None
        final = None
        parts = None
        if record is not None:
            retry = self._store.get_retry(name) if isinstance(self._store, RetryingStore) else None
            doc = retry.doc if retry is not None else None
            view = record_to_json(record, *record_outcome(self._store, name), doc)
            results = results_json(self._store, name)
            if doc is not None:
                # Imported for records with a retry state only, as the record view does.
                from opstate.domain.retry import final_view, is_member

                final = None if is_member(doc) else final_view(doc)
                if isinstance(doc.get("job"), Mapping):
                    parts = _job_parts(self._store, doc["job"])
        body = {
            "now": format_time(self._clock_ns()),
            "record": view,
            "terminal": record.terminal if record is not None else None,
            "decisions": decisions,
            # The archive and its ledger (opstate results --json), None when not known yet.
            "results": results,
            # A retry root's one result per request key (pending until final.jsonl is written).
            "final": final,
            # A job's parts (docs/jobs.md), in input order: never a part's nonce or upload.
            "parts": parts,
        }
        return self._data(200, body)

    def _refresh_one(self, raw_name: str) -> tuple[int, list[tuple[str, str]], bytes]:
        if self._refresh is None:
            return self._data(
                409,
                _error(
                    "no-gemini-key",
                    "polling Gemini needs an API key: start opstate serve with GEMINI_API_KEY",
                ),
            )
        try:
            name, record = self._find(raw_name)
        except InvalidNameError as exc:
            return self._data(400, _error("invalid-name", str(exc)))
        status, body = self._refresh(record.name if record is not None else name)
        return self._data(status, body)

    # --- responses --------------------------------------------------------------------------

    def _file(self, name: str, content_type: str) -> tuple[int, list[tuple[str, str]], bytes]:
        headers = [("Content-Type", content_type), *_COMMON_HEADERS]
        if name == "index.html":
            headers.append(("Content-Security-Policy", CSP))
        return 200, headers, _static(name)

    def _data(
        self, status: int, body: Mapping[str, Any]
    ) -> tuple[int, list[tuple[str, str]], bytes]:
        payload = json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
        return status, [("Content-Type", "application/json"), *_COMMON_HEADERS], payload

    def _json(
        self, start_response: StartResponse, status: int, body: Mapping[str, Any]
    ) -> Iterable[bytes]:
        status_, headers, payload = self._data(status, body)
        start_response(_status(status_), [*headers, ("Content-Length", str(len(payload)))])
        return [payload]


def _job_parts(store: Store, plan: Mapping[str, Any]) -> list[dict[str, Any]]:
    """A job's parts as the page lists them, in input order (at most ``MAX_JOB_PARTS``):
    ``{n, first, rows, tokens, phase, refusals, batch, state, dueAt}``: ``state`` the stored
    state of a created part's batch (read for created parts only: at most the open batches),
    ``dueAt`` when a refused held part tries again. Only these fields: a part's nonce and its
    upload are never shown. A value of the wrong type is null (the plan is read as untrusted)."""
    raw = plan.get("parts")
    shown: list[dict[str, Any]] = []
    for part in raw[:MAX_JOB_PARTS] if isinstance(raw, list) else []:
        if not isinstance(part, Mapping):
            continue
        batch = part.get("batch") if isinstance(part.get("batch"), str) else None
        phase = part.get("phase") if isinstance(part.get("phase"), str) else None
        state = None
        due = _count(part.get("dueNs"))
        if batch is not None and phase == "created":
            record = store.get(batch)
            state = str(record.state) if record is not None else None
        shown.append(
            {
                "n": _count(part.get("n")),
                "first": _count(part.get("first")),
                "rows": _count(part.get("rows")),
                "tokens": _count(part.get("tokens")),
                "phase": phase,
                "refusals": _count(part.get("refusals")),
                "batch": batch,
                "state": state,
                # A held part refused before backs off until then (docs/jobs.md, "Feeding").
                "dueAt": format_time(due) if phase == "held" and due and 0 < due < 2**63 else None,
            }
        )
    return shown


def _count(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _error(code: str, message: str) -> dict[str, str]:
    return {"error": code, "message": message}


_REASONS = {
    200: "OK",
    400: "Bad Request",
    401: "Unauthorized",
    404: "Not Found",
    405: "Method Not Allowed",
    409: "Conflict",
    503: "Service Unavailable",
}


def _status(code: int) -> str:
    return f"{code} {_REASONS.get(code, 'Unknown')}"
