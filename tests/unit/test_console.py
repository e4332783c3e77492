"""The operations page's WSGI layer: routes, token check, JSON shapes, the decision log."""

from __future__ import annotations

import io
import json
import re
import tomllib
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest

from opstate.api_token import bearer_token_ok
from opstate.domain.model import OpEvent, OpRecord
from opstate.domain.states import State
from opstate.domain.times import format_time, parse_time
from opstate.ingest import ingest
from opstate.local.console import CSP, Console, DecisionLog, Refresher
from opstate.reconcile.schedule import Mark
from opstate.reconcile.tally import MarkDecision
from opstate.store import MemoryStore
from opstate.store.port import PollState, StoreUnavailableError

ROOT = Path(__file__).resolve().parents[2]
STATIC = ROOT / "layers" / "opstate" / "opstate" / "local" / "static"
TOKEN = "console-test-token-0123456789abcdef"
NOW = parse_time("2026-05-10T10:00:00Z")


def authorized(headers: Mapping[str, str]) -> bool:
    return bearer_token_ok(headers.get("authorization"), TOKEN)


class Inner:
    """The API app behind the console: records what reached it."""

    def __init__(self) -> None:
        self.paths: list[str] = []

    def __call__(self, environ: dict[str, Any], start_response: Any) -> Iterable[bytes]:
        self.paths.append(environ["PATH_INFO"])
        start_response("200 OK", [("Content-Type", "application/json")])
        return [b'{"api":true}']


class Harness:
    def __init__(self, store: Any = None, refresh: Refresher | None = None) -> None:
        self.store = store if store is not None else MemoryStore()
        self.decisions = DecisionLog(clock_ns=lambda: NOW)
        self.inner = Inner()
        self.app = Console(
            self.inner,
            store=self.store,
            decisions=self.decisions,
            authorized=authorized,
            clock_ns=lambda: NOW,
            refresh=refresh,
        )

    def get(
        self, path: str, query: str = "", token: str | None = TOKEN, method: str = "GET"
    ) -> tuple[int, dict[str, str], bytes]:
        environ: dict[str, Any] = {
            "REQUEST_METHOD": method,
            "PATH_INFO": path,
            "QUERY_STRING": query,
            "wsgi.input": io.BytesIO(b""),
        }
        if token is not None:
            environ["HTTP_AUTHORIZATION"] = f"Bearer {token}"
        seen: dict[str, Any] = {}

        def start_response(status: str, headers: list[tuple[str, str]]) -> None:
            seen["status"] = int(status.split()[0])
            seen["headers"] = {k.lower(): v for k, v in headers}

        body = b"".join(self.app(environ, start_response))
        return seen["status"], seen["headers"], body

    def json(self, path: str, query: str = "", token: str | None = TOKEN) -> tuple[int, Any]:
        status, headers, body = self.get(path, query, token)
        assert headers["content-type"] == "application/json"
        assert headers["cache-control"] == "no-store"
        return status, json.loads(body)

    def event(self, name: str, state: State, time: str, source: str = "webhook") -> None:
        decision = ingest(
            self.store,
            OpEvent(name, state, parse_time(time), source, {"t": time}),
            clock_ns=lambda: NOW,
        )
        self.decisions.add(decision)


@pytest.fixture
def h() -> Harness:
    return Harness()


def test_the_page_and_its_files_need_no_token_and_forbid_foreign_origins(h: Harness) -> None:
    status, headers, body = h.get("/", token=None)
    assert status == 200 and headers["content-type"].startswith("text/html")
    assert headers["content-security-policy"] == CSP
    assert b'<script src="/ui/static/console.js"' in body
    for name, kind in (("console.js", "text/javascript"), ("console.css", "text/css")):
        status, headers, body = h.get(f"/ui/static/{name}", token=None)
        assert status == 200 and headers["content-type"].startswith(kind) and body
    assert h.get("/ui/static/../console.py", token=None)[0] == 404
    assert h.get("/ui/static/secret", token=None)[0] == 404
    assert h.inner.paths == []


def test_the_assets_reach_nothing_outside_the_server() -> None:
    for path in STATIC.iterdir():
        # An XML namespace is a name, not a fetch.
        text = path.read_text(encoding="utf-8").replace('xmlns="http://www.w3.org/2000/svg"', "")
        assert not re.search(r"(https?:)?//[a-z0-9.-]+\.[a-z]{2,}", text, re.I), path
        assert "innerHTML" not in text, path
    html = (STATIC / "index.html").read_text(encoding="utf-8")
    assert set(re.findall(r'(?:src|href)="/ui/static/([^"]+)"', html)) == {
        "console.js",
        "console.css",
        "favicon.svg",
    }
    assert "<script>" not in html  # no inline script: the CSP allows 'self' only


def test_the_static_files_are_package_data() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    data = config["tool"]["setuptools"]["package-data"]["opstate"]
    assert "local/static/*" in data


@pytest.mark.parametrize("token", [None, "", "wrong-token-wrong-token-wrong-token"])
def test_data_needs_the_token(h: Harness, token: str | None) -> None:
    h.event("batches/a", State.RUNNING, "2026-05-10T09:00:00Z")
    for path, query in (("/ui/api/operations", ""), ("/ui/api/operation", "name=batches/a")):
        status, headers, body = h.get(path, query, token)
        assert status == 401, path
        assert headers["www-authenticate"].startswith("Bearer")
        assert b"batches/a" not in body


def test_operations_newest_first_without_details(h: Harness) -> None:
    h.event("batches/old", State.RUNNING, "2026-05-10T08:00:00Z")
    h.store.put_if_absent(
        OpRecord(
            "batches/new",
            State.SUCCEEDED,
            parse_time("2026-05-10T09:00:00Z"),
            1,
            "poll",
            {"x": 1},
            NOW + 5,
            NOW + 5,
        )
    )
    status, body = h.json("/ui/api/operations")
    assert status == 200
    assert body["changed"] is True and body["total"] == 2 and body["cursor"] == "1"
    assert body["now"] == "2026-05-10T10:00:00.000000000Z"
    assert [op["name"] for op in body["operations"]] == ["batches/new", "batches/old"]
    new = body["operations"][0]
    assert "details" not in new
    assert (new["kind"], new["state"], new["version"], new["terminal"]) == (
        "batch",
        "SUCCEEDED",
        1,
        True,
    )
    assert new["updateTime"] == "2026-05-10T09:00:00.000000000Z"


def test_an_unchanged_cursor_answers_without_reading_the_store() -> None:
    class NoListing(MemoryStore):
        def iter_all(self) -> Iterator[OpRecord]:
            raise AssertionError("the store was read")

    h = Harness(NoListing())
    h.event("batches/a", State.RUNNING, "2026-05-10T09:00:00Z")
    status, body = h.json("/ui/api/operations", "since=1")
    assert (status, body["changed"], body["cursor"]) == (200, False, "1")
    h.event("batches/a", State.SUCCEEDED, "2026-05-10T09:30:00Z")
    with pytest.raises(AssertionError, match="the store was read"):
        h.get("/ui/api/operations", "since=1")


def test_one_operation_with_its_decisions_applied_and_dropped(h: Harness) -> None:
    h.event("batches/a", State.RUNNING, "2026-05-10T09:00:00Z", "poll")
    h.event("batches/a", State.SUCCEEDED, "2026-05-10T09:30:00Z")
    h.event("batches/a", State.SUCCEEDED, "2026-05-10T09:30:00Z")  # the stale redelivery
    status, body = h.json("/ui/api/operation", "name=batches%2Fa")
    assert status == 200
    assert body["record"]["details"] == {"t": "2026-05-10T09:30:00Z"}
    assert body["terminal"] is True
    assert [(d["applied"], d["reason"], d["source"], d["version"]) for d in body["decisions"]] == [
        (True, "created", "poll", 1),
        (True, "advanced", "webhook", 2),
        (False, "stale-or-equal-update-time", "webhook", 2),
    ]
    assert body["decisions"][2]["updateTime"] == "2026-05-10T09:30:00.000000000Z"
    assert body["decisions"][2]["receivedAt"] == "2026-05-10T10:00:00.000000000Z"
    # Other spellings of the name find the same operation.
    assert h.json("/ui/api/operation", "name=batches/a")[1] == body


def test_unknown_and_invalid_names(h: Harness) -> None:
    assert h.json("/ui/api/operation", "name=batches/nope")[0] == 404
    status, body = h.json("/ui/api/operation", "name=")
    assert status == 400 and body["error"] == "invalid-name"


def test_records_an_earlier_release_keyed_otherwise_are_opened_and_polled_by_their_keys() -> None:
    """Issue 31 §4: a Google Cloud job keyed with its location as written and a video keyed by
    its full name (earlier releases) are listed under those keys; the page opens each by the
    name its row shows, as the API and the CLI find them (``find_record``), with the decisions
    filed under that key, and "poll now" polls the record under its own key."""
    cloud_old = "projects/p1/locations/US-CENTRAL1/batchPredictionJobs/7"
    video_old = "models/veo-3.0-generate-001/operations/v1"
    store = MemoryStore()
    for name in (cloud_old, video_old):
        store.put_if_absent(OpRecord(name, State.RUNNING, NOW - 20, 2, "report", {}))
    polled: list[str] = []

    def refresh(name: str) -> tuple[int, dict[str, Any]]:
        polled.append(name)
        return 200, {"name": name, "message": "polled"}

    h = Harness(store, refresh=refresh)
    # The reconciler's answer, renamed to the record it polled (as run.py does), is decided.
    h.decisions.add(
        ingest(
            store, OpEvent(cloud_old, State.SUCCEEDED, NOW - 10, "poll", {}), clock_ns=lambda: NOW
        )
    )
    status, listing = h.json("/ui/api/operations")
    assert status == 200
    assert sorted(op["name"] for op in listing["operations"]) == sorted([cloud_old, video_old])
    for name, state, version, decided in (
        (cloud_old, "SUCCEEDED", 3, [(True, "advanced")]),
        (video_old, "RUNNING", 2, []),
    ):
        status, body = h.json("/ui/api/operation", "name=" + quote(name, safe=""))
        assert status == 200, body
        assert (body["record"]["name"], body["record"]["state"]) == (name, state)
        assert body["record"]["version"] == version
        assert [(d["applied"], d["reason"]) for d in body["decisions"]] == decided
        status, _, answer = h.get("/ui/api/refresh", "name=" + quote(name, safe=""), method="POST")
        assert (status, json.loads(answer)["name"]) == (200, name)
    assert polled == [cloud_old, video_old]
    # A name no record has is still the refresher's to answer (under its canonical key).
    h.get("/ui/api/refresh", "name=" + quote(cloud_old.replace("/7", "/8"), safe=""), method="POST")
    assert polled[-1] == "projects/p1/locations/us-central1/batchPredictionJobs/8"


def test_store_faults_are_503() -> None:
    class Down(MemoryStore):
        def iter_all(self) -> Iterator[OpRecord]:
            raise StoreUnavailableError("locked")

        def get(self, name: str) -> OpRecord | None:
            raise StoreUnavailableError("locked")

    h = Harness(Down())
    assert h.json("/ui/api/operations")[0] == 503
    assert h.json("/ui/api/operation", "name=batches/a")[0] == 503


def test_everything_else_goes_to_the_api(h: Harness) -> None:
    for path in ("/gemini/webhook", "/operations/batches/a", "/favicon.ico"):
        status, _, body = h.get(path, token=None)
        assert (status, body) == (200, b'{"api":true}')
    assert h.inner.paths == ["/gemini/webhook", "/operations/batches/a", "/favicon.ico"]
    assert h.get("/", method="POST")[0] == 405
    assert h.get("/ui/api/nothing")[0] == 404
    status, headers, body = h.get("/", method="HEAD", token=None)
    assert status == 200 and body == b"" and int(headers["content-length"]) > 0


def test_the_decision_log_is_bounded() -> None:
    log = DecisionLog(per_operation=3, max_operations=2, clock_ns=lambda: NOW)
    store = MemoryStore()
    for i in range(5):
        event = OpEvent("batches/a", State.RUNNING, NOW + i, "poll", {})
        log.add(ingest(store, event, clock_ns=lambda: NOW))
    assert [d["seq"] for d in log.for_operation("batches/a")] == [3, 4, 5]
    for name in ("batches/b", "batches/c"):
        log.add(
            ingest(store, OpEvent(name, State.PENDING, NOW, "report", {}), clock_ns=lambda: NOW)
        )
    assert log.for_operation("batches/a") == []  # the least recently decided was forgotten
    assert len(log.for_operation("batches/c")) == 1
    assert log.cursor == 7
    with pytest.raises(ValueError):
        DecisionLog(per_operation=0)


def test_the_reconcilers_marks_reach_the_log_and_move_its_cursor() -> None:
    """A lost or overdue mark changes no state but is news: the page must redraw."""
    log = DecisionLog(clock_ns=lambda: NOW)
    record = OpRecord("batches/gone", State.RUNNING, NOW - 10, 4, "poll")
    log.add(MarkDecision(Mark.LOST, record, PollState(due_ns=NOW, misses=3, lost_ns=NOW)))
    assert log.cursor == 1
    (entry,) = log.for_operation("batches/gone")
    assert entry == {
        "receivedAt": format_time(NOW),
        "applied": False,
        "reason": "lost",
        "state": "RUNNING",
        "storedState": "RUNNING",
        "version": 4,
        "source": "poll",
        "updateTime": format_time(NOW - 10),
        "seq": 1,
    }
