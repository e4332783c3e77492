"""Whatever a sender puts in details, never a 500, never a write on a 4xx, and a state always
applies: on SQLite and on DynamoDB (moto, which does not enforce every DynamoDB limit, so the
checks in ``opstate.domain.details`` must)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from botocore.exceptions import ClientError
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from opstate.domain import strict_json
from opstate.domain.details import MAX_DETAILS_BYTES, size
from opstate.domain.model import OpEvent, OpRecord, Reason
from opstate.domain.states import State
from opstate.domain.times import parse_time
from opstate.ingest import ingest
from opstate.store.dynamodb import DynamoDBStore, serialize_item
from opstate.store.port import RecordRejectedError
from tests.support.stores import Harness, harness_for, signed_app
from tests.support.webhooks import (
    operation_event,
    signed_headers,
    webhook_event,
)

NOW_NS = parse_time("2026-05-10T10:00:00Z")
KINDS = ("sqlite", "dynamodb-mock")
PROPS = settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)


@pytest.fixture(params=KINDS)
def harness(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Harness]:
    with harness_for(
        request.param, tmp_path=tmp_path, moto_endpoint=lambda: "", clock=lambda: NOW_NS
    ) as h:
        yield h


def app_for(harness: Harness) -> Any:
    return signed_app(harness.store, NOW_NS)


def call(app: Any, event: dict[str, Any]) -> tuple[int, Any]:
    response = app.resolve(event, None)
    body = response.get("body") or ""
    body.encode("utf-8")  # a response must always be encodable
    return int(response["statusCode"]), json.loads(body) if body else None


def webhook(app: Any, body: bytes, msg_id: str = "msg_details") -> tuple[int, Any]:
    return call(app, webhook_event(body, signed_headers(body, msg_id=msg_id)))


# JSON text of numbers Python parses fine and a store may not hold.
extreme_numbers = st.sampled_from(
    [
        "1e300",
        "-1e300",
        "1e-200",
        "1e400",  # Python reads this as inf
        "-1e400",
        "1" + "0" * 38,  # 39 digits, one significant: fine
        "1" * 39,  # 39 significant digits: DynamoDB refuses
        "9" * 38,
        "1e125",
        "1e126",
        "1e-130",
        "1e-131",
        "0.000",
        "-0",
        "12345678901234567890123456789012345678.5",
    ]
) | st.integers(-(10**45), 10**45).map(str)
surrogate_texts = st.text(
    alphabet=st.characters(min_codepoint=0xD7F0, max_codepoint=0xE010, codec=None), max_size=4
)
scalars = (
    st.none().map(lambda _: "null")
    | st.booleans().map(lambda b: "true" if b else "false")
    | extreme_numbers
    | st.text(max_size=10).map(json.dumps)
    | surrogate_texts.map(json.dumps)  # ensure_ascii: "\ud800" escapes
)


@st.composite
def json_texts(draw: st.DrawFn, depth: int = 0) -> str:
    """JSON text (not values: so numbers and escapes reach the parser as a sender wrote them)."""
    if depth >= 3 or draw(st.booleans()):
        return draw(scalars)
    if draw(st.booleans()):
        items = draw(st.lists(json_texts(depth + 1), max_size=3))
        return "[" + ",".join(items) + "]"
    keys = draw(st.lists(st.text(max_size=6) | surrogate_texts, max_size=3, unique=True))
    return "{" + ",".join(f"{json.dumps(k)}:{draw(json_texts(depth + 1))}" for k in keys) + "}"


details_texts = st.one_of(
    extreme_numbers,
    surrogate_texts.map(json.dumps),
    json_texts(),
    st.integers(1, 200).map(lambda n: "[" * n + "]" * n),  # nesting
    st.integers(1, 200).map(lambda n: '{"a":' * n + "1" + "}" * n),
    st.integers(60_000, 120_000).map(lambda n: json.dumps("x" * n)),  # size
    st.integers(1, 5).map(lambda n: json.dumps({f"k{i}": "y" * 30_000 for i in range(n)})),
)


def snapshot(harness: Harness, name: str) -> Any:
    return harness.raw(name)


@PROPS
@given(value=details_texts)
def test_reports_never_500_and_never_write_on_4xx(harness: Harness, value: str) -> None:
    app = app_for(harness)
    name = "batches/report-fuzz"
    before = snapshot(harness, name)
    body = ('{"state":"RUNNING","details":{"v":' + value + "}}").encode()
    status, answer = call(app, operation_event("PUT", name, body))
    assert status in (200, 400, 413), answer
    if status != 200:
        assert snapshot(harness, name) == before
        if status == 400:
            assert answer["error"] in ("invalid-details", "malformed-json")
    else:
        get_status, record = call(app, operation_event("GET", name))
        assert get_status == 200 and size(record["details"]) <= MAX_DETAILS_BYTES


@PROPS
@given(value=details_texts, state=st.sampled_from(["succeeded", "failed", "cancelled"]))
@example(value="1e400", state="succeeded")  # valid JSON grammar, only a float infinity holds it
def test_gemini_state_applies_whatever_its_details(
    harness: Harness, value: str, state: str
) -> None:
    app = app_for(harness)
    name = f"batches/hook-fuzz-{state}"
    body = (
        '{"type":"batch.' + state + '","timestamp":"2026-05-10T09:00:00Z",'
        '"data":{"id":"' + name + '","user_metadata":' + value + "}}"
    ).encode()
    status, answer = webhook(app, body)
    assert status == 200, answer  # a signed delivery is never refused
    try:
        strict_json.loads(body)  # the webhook's own rule (e.g. 1e400 is refused, not infinity)
    except (ValueError, RecursionError):
        assert answer["reason"] == "quarantined"  # kept whole for a replay
        return
    stored = harness.store.get(name)
    assert stored is not None and stored.state == State(state.upper())
    get_status, record = call(app, operation_event("GET", name))
    assert get_status == 200 and size(record["details"]) <= MAX_DETAILS_BYTES


@pytest.mark.parametrize("value", ["1e300", "1e-200", "1" * 39, "[" * 40 + "]" * 40])
def test_a_report_beyond_the_stores_limits_is_400_invalid_details(
    harness: Harness, value: str
) -> None:
    app = app_for(harness)
    body = ('{"details":{"user_metadata":{"n":' + value + "}}}").encode()
    status, answer = call(app, operation_event("PUT", "batches/limits", body))
    assert (status, answer["error"]) == (400, "invalid-details")
    assert harness.raw("batches/limits") is None


@pytest.mark.parametrize("value", ["1e300", "1e-200", "1" * 39, "[" * 160 + "]" * 160])
def test_a_webhook_beyond_the_stores_limits_still_applies(harness: Harness, value: str) -> None:
    app = app_for(harness)
    body = (
        '{"type":"batch.succeeded","timestamp":"2026-05-10T09:00:00Z",'
        '"data":{"id":"batches/limits","output_file_uri":"files/out",'
        '"user_metadata":{"n":' + value + ',"ok":1}}}'
    ).encode()
    status, answer = webhook(app, body)
    assert (status, answer["applied"], answer["state"]) == (200, True, "SUCCEEDED")
    record = harness.store.get("batches/limits")
    assert record is not None and record.details["output_file_uri"] == "files/out"
    assert record.details["user_metadata"]["ok"] == 1


def test_reports_cannot_grow_a_record_past_the_cap_and_gemini_still_applies(
    harness: Harness,
) -> None:
    app = app_for(harness)
    name = "batches/growing"
    for i in range(12):  # 12 reports of ~30 KB each, every one valid on its own
        body = json.dumps(
            {
                "state": "RUNNING",
                "updateTime": f"2026-05-10T08:00:{i:02d}Z",
                "details": {f"k{i}": "z" * 30_000},
            }
        ).encode()
        status, _ = call(app, operation_event("PUT", name, body))
        assert status == 200
        record = harness.store.get(name)
        assert record is not None and size(record.details) <= MAX_DETAILS_BYTES
    body = json.dumps(
        {
            "type": "batch.succeeded",
            "timestamp": "2026-05-10T09:00:00Z",
            "data": {"id": name, "output_file_uri": "files/result"},
        }
    ).encode()
    status, answer = webhook(app, body)
    assert (status, answer["applied"], answer["state"]) == (200, True, "SUCCEEDED")
    record = harness.store.get(name)
    assert record is not None and record.details["output_file_uri"] == "files/result"


def test_an_old_record_near_the_item_limit_still_takes_its_terminal_state(
    harness: Harness,
) -> None:
    """A record the previous release let grow to ~300 KB of details (stored data is a contract):
    the next state change trims the carried-over details and fits."""
    name = "batches/old-huge"
    old = OpRecord(
        name,
        State.RUNNING,
        parse_time("2026-05-10T08:00:00Z"),
        7,
        "report",
        {f"k{i}": "w" * 30_000 for i in range(10)},
        created_ns=NOW_NS,
        applied_ns=NOW_NS,
    )
    if harness.kind == "sqlite":
        conn = harness.store._conn()  # type: ignore[attr-defined]
        row = harness.store._row(  # type: ignore[attr-defined]
            OpRecord(
                name,
                old.state,
                old.update_time_ns,
                old.version,
                old.source,
                {},
                old.created_ns,
                old.applied_ns,
            )
        )
        conn.execute(
            "INSERT INTO operations (name, state, rank, update_ns, version, kind, source,"
            " details, created_ns, applied_ns, open_ns, expires_at)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (*row[:7], json.dumps(dict(old.details)), *row[8:]),
        )
    else:
        item = harness.store.item(old)  # type: ignore[attr-defined]
        harness.client.put_item(TableName=harness.table, Item=serialize_item(item))
    event = OpEvent(
        name,
        State.SUCCEEDED,
        parse_time("2026-05-10T09:00:00Z"),
        "webhook",
        {"output_file_uri": "files/r"},
    )
    decision = ingest(harness.store, event, clock_ns=lambda: NOW_NS)
    assert decision.applied and decision.reason is Reason.ADVANCED
    record = harness.store.get(name)
    assert record is not None and record.state is State.SUCCEEDED
    assert record.details["output_file_uri"] == "files/r"
    assert size(record.details) <= MAX_DETAILS_BYTES


def test_a_validation_exception_is_a_permanent_refusal_and_ingest_drops_it() -> None:
    """A ValidationException that still reaches DynamoDB (a limit we do not model) is never
    a 500 and never retried: ingest writes the state alone, or drops the event."""

    class Refusing:
        def __init__(self, refuse_all: bool) -> None:
            self.refuse_all = refuse_all
            self.items: list[dict[str, Any]] = []

        def get_item(self, **_: Any) -> dict[str, Any]:
            return {}

        def update_item(self, **_: Any) -> dict[str, Any]:
            # The one-call write on a table without the item: its condition fails, no item.
            raise ClientError(
                {
                    "Error": {"Code": "ConditionalCheckFailedException", "Message": "failed"},
                    "ResponseMetadata": {"HTTPStatusCode": 400},
                },
                "UpdateItem",
            )

        def put_item(self, **kwargs: Any) -> dict[str, Any]:
            if self.refuse_all or kwargs["Item"]["details"]["M"]:
                raise ClientError(
                    {
                        "Error": {"Code": "ValidationException", "Message": "Item size too big"},
                        "ResponseMetadata": {"HTTPStatusCode": 400},
                    },
                    "PutItem",
                )
            self.items.append(kwargs["Item"])
            return {}

    event = OpEvent("batches/v", State.SUCCEEDED, 5, "webhook", {"output_file_uri": "files/o"})
    client = Refusing(refuse_all=False)
    store = DynamoDBStore("t", client=client, clock=lambda: NOW_NS)
    with pytest.raises(RecordRejectedError, match="Item size too big"):
        store.put_if_absent(OpRecord("batches/v", State.RUNNING, 1, 1, "poll", {"a": 1}))
    decision = ingest(store, event, clock_ns=lambda: NOW_NS)
    assert decision.applied and client.items[-1]["state"] == {"S": "SUCCEEDED"}
    decision = ingest(
        DynamoDBStore("t", client=Refusing(refuse_all=True)), event, clock_ns=lambda: NOW_NS
    )
    assert not decision.applied and decision.reason is Reason.STORE_REJECTED
