"""The archiver against hostile or broken inputs (issue 31, part 3), each on the real
google-genai client and the fake Gemini: a ledger too big for a DynamoDB item, one entry's
failure, a summary.json planted under the results prefix, a location outside the results
folder, a line without a newline (gzip-encoded), a download shorter than Gemini declared, a
malformed output file name."""

from __future__ import annotations

import base64
import gzip
import hashlib
import json
import time
import tracemalloc
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from botocore.exceptions import ClientError

from opstate.config import Settings, settings
from opstate.domain.model import OpEvent
from opstate.domain.states import State
from opstate.domain.times import NS_PER_SECOND
from opstate.ingest import ingest
from opstate.outcomes.file_sink import FileSink
from opstate.outcomes.genai_source import GenaiSource, make_client
from opstate.outcomes.plan import prefix_of
from opstate.outcomes.results import results_json
from opstate.outcomes.run import archive_once
from opstate.store import MemoryStore
from opstate.store.port import ArchiveState, ArchivingStore
from tests.support.cli import in_process
from tests.support.fake_gemini import FakeGemini
from tests.support.outcomes import Clock, batch_output, failed_line, now_text, ok_line, worst_case

KEY = "test-key"
MiB = 1024 * 1024
SETTINGS = Settings(results_retry_s=10)


@pytest.fixture
def source(fake_gemini: FakeGemini, monkeypatch: pytest.MonkeyPatch) -> Iterator[GenaiSource]:
    fake_gemini.api_key = KEY
    monkeypatch.setenv("GOOGLE_GEMINI_BASE_URL", fake_gemini.base_url)
    made = GenaiSource(make_client(Settings(gemini_api_key=KEY, results_http_timeout_s=10)))
    yield made
    made.close()


def batch(fake: FakeGemini, store: ArchivingStore, name: str, data: bytes, **file: Any) -> str:
    """A SUCCEEDED batch ``name`` whose output file holds ``data`` (``file``: put_file's
    options), terminal in ``store``; returns the file's name."""
    file.setdefault("body", data)
    found = fake.put_file(name.split("/")[-1], expiration_time=now_text(86400), **file)
    fake.put_batch(name, "SUCCEEDED", responses_file=found)
    t = time.time_ns()
    ingest(store, OpEvent(name, State.SUCCEEDED, t, "poll", {}), clock_ns=lambda: t)
    return found


def downloads(fake: FakeGemini) -> int:
    return sum(1 for r in fake.requests if r.verb == "download")


# --- 1. the archive state item stays under DynamoDB's 400 KB; one entry never ends the pass ----


def test_a_ledger_of_long_codes_fits_the_item_and_the_pass_goes_on(
    fake_gemini: FakeGemini, source: GenaiSource, tmp_path: Path
) -> None:
    from moto import mock_aws

    from tests.support.stores import dynamodb_harness, shared_client

    long_codes = [f"{i:03d}-" + "x" * 4096 for i in range(100)]
    lines = [json.dumps({"key": str(i), "status": {"code": c}}) for i, c in enumerate(long_codes)]
    data = ("\n".join(lines) + "\n").encode()
    good, expected = batch_output(3, {429: 1})
    with mock_aws():
        store = dynamodb_harness(shared_client(), kind="dynamodb-mock").store
        assert isinstance(store, ArchivingStore)
        batch(fake_gemini, store, "batches/a-long-codes", data)
        batch(fake_gemini, store, "batches/b-after", good)
        result = archive_once(store, source, FileSink(tmp_path / "r"), settings=SETTINGS)
        assert (result.archived, result.failed, result.errors) == (2, 0, 0), result
        view = results_json(store, "batches/a-long-codes")
        assert view is not None and view["status"] == "archived"
        assert view["rows"] == {
            "total": 100,
            "succeeded": 0,
            "blocked": 0,
            "failed": 100,
            "unreadable": 0,
        }
        assert sum(view["errors"].values()) == 100
        assert all(len(code) <= 64 for code in view["errors"])
        after = results_json(store, "batches/b-after")
        assert after is not None and after["rows"] == expected.rows


def test_the_largest_state_the_bounds_allow_is_written_beside_the_largest_record() -> None:
    """On (moto) DynamoDB: a record with the longest name and 64 KiB of details, then the
    largest archive state every bound of ``outcomes.summary`` allows, written and read back."""
    from dataclasses import replace

    from moto import mock_aws

    from opstate.domain.details import MAX_DETAILS_BYTES
    from opstate.domain.details import size as details_size
    from tests.support.stores import dynamodb_harness, shared_client

    record, state = worst_case()
    details = {"blob": "d" * (MAX_DETAILS_BYTES - 20)}
    assert details_size(details) <= MAX_DETAILS_BYTES
    with mock_aws():
        store = dynamodb_harness(shared_client(), kind="dynamodb-mock").store
        assert isinstance(store, ArchivingStore)
        t = time.time_ns()
        ingest(store, OpEvent(record.name, State.SUCCEEDED, t, "poll", details), clock_ns=lambda: t)
        stored = store.get(record.name)
        assert stored is not None and details_size(stored.details) > MAX_DETAILS_BYTES - 100
        state = replace(state, created_ns=stored.created_ns, rev=0)
        assert store.set_archive(record.name, 0, state)
        back = store.get_archive(record.name)
        assert back is not None and back.summary == state.summary


class RefusingStore(MemoryStore):
    """A store that refuses (as DynamoDB does an item over 400 KB) the archived state of one
    name."""

    def __init__(self, refuse: str) -> None:
        super().__init__()
        self.refuse = refuse

    def set_archive(self, name: str, expected_rev: int, state: ArchiveState) -> bool:
        if name == self.refuse and state.status == "archived":
            raise ClientError(
                {"Error": {"Code": "ValidationException", "Message": "Item size too large"}},
                "UpdateItem",
            )
        return super().set_archive(name, expected_rev, state)


def test_one_entrys_failure_is_that_entrys_failed_not_the_end_of_the_pass(
    fake_gemini: FakeGemini, source: GenaiSource, tmp_path: Path
) -> None:
    store = RefusingStore("batches/a-refused")
    data, _ = batch_output(2, {})
    batch(fake_gemini, store, "batches/a-refused", data)
    batch(fake_gemini, store, "batches/b-fine", data)
    result = archive_once(store, source, FileSink(tmp_path / "r"), settings=SETTINGS)
    assert (result.archived, result.failed) == (1, 1), result
    refused = store.get_archive("batches/a-refused")
    assert refused is not None and refused.status == "failed" and refused.attempts == 1
    assert "ValidationException" in refused.last_error
    fine = store.get_archive("batches/b-fine")
    assert fine is not None and fine.status == "archived"


# --- 2. a summary.json found under the prefix is checked, never trusted -----------------------


def plant(
    root: Path,
    store: MemoryStore,
    name: str,
    objects: dict[str, bytes],
    summary: dict[str, Any] | None = None,
) -> Path:
    """Write ``objects`` and a summary.json listing them (``summary`` overrides its fields)
    where the archive of ``name`` goes; returns that folder."""
    record = store.get(name)
    assert record is not None
    folder = root / prefix_of(record)
    folder.mkdir(parents=True)
    listed = []
    for key, body in objects.items():
        (folder / key).write_bytes(body)
        listed.append(
            {
                "location": (folder / key).as_uri(),
                "bytes": len(body),
                "sha256": hashlib.sha256(body).hexdigest(),
            }
        )
    document = {
        "name": name,
        "kind": "batch",
        "state": "SUCCEEDED",
        "objects": listed,
        "rows": {"total": 1_000_000, "succeeded": 1_000_000, "failed": 0, "unreadable": 0},
        "errors": {},
        "usage": {"totalTokenCount": 10**12},
        "requests": None,
        **(summary or {}),
    }
    (folder / "summary.json").write_text(json.dumps(document))
    return folder


def test_a_planted_summary_is_never_trusted(
    fake_gemini: FakeGemini, source: GenaiSource, tmp_path: Path
) -> None:
    root = tmp_path / "r"
    sink = FileSink(root)
    store = MemoryStore()
    data, expected = batch_output(4, {13: 1})
    secret = tmp_path / "secret.txt"
    secret.write_bytes(b"not yours")
    # Forged counts over forged bytes.
    batch(fake_gemini, store, "batches/forged", data)
    plant(root, store, "batches/forged", {"output.jsonl": b'{"response": {}}\n'})
    # Another operation's summary (a name that maps to the same folder).
    batch(fake_gemini, store, "batches/named", data)
    plant(root, store, "batches/named", {"output.jsonl": data}, {"name": "batches/other"})
    # Objects listed outside the results folder.
    batch(fake_gemini, store, "batches/outside", data)
    outside = f"{root.as_uri()}/../{secret.name}"
    plant(
        root,
        store,
        "batches/outside",
        {"output.jsonl": data},
        {"objects": [{"location": outside, "bytes": len(data), "sha256": ""}]},
    )
    # The real bytes, but through a link under the root to a file outside it.
    batch(fake_gemini, store, "batches/linked", data)
    elsewhere = tmp_path / "elsewhere.jsonl"
    elsewhere.write_bytes(data)
    folder = plant(root, store, "batches/linked", {"output.jsonl": data})
    (folder / "output.jsonl").unlink()
    (folder / "output.jsonl").symlink_to(elsewhere)
    # Forged counts over the real bytes: the counts are read again from the copy.
    batch(fake_gemini, store, "batches/recount", data)
    plant(root, store, "batches/recount", {"output.jsonl": data})
    result = archive_once(store, source, sink, settings=SETTINGS)
    assert (result.archived, result.failed) == (5, 0), result
    names = ("batches/forged", "batches/named", "batches/outside", "batches/linked")
    for name in (*names, "batches/recount"):
        view = results_json(store, name)
        assert view is not None and view["status"] == "archived", name
        assert view["rows"] == expected.rows and view["usage"] == expected.usage, name
        (obj,) = view["objects"]
        assert obj["sha256"] == hashlib.sha256(data).hexdigest(), name
        stored = Path(obj["location"].removeprefix("file://"))
        assert stored.is_relative_to(root) and stored.read_bytes() == data, name
        assert not stored.is_symlink(), name  # the copy replaced the link, not its target
        summary = json.loads((stored.parent / "summary.json").read_text())
        assert summary["name"] == name and summary["rows"] == expected.rows, name
    # The real bytes were already there for one of them: it was not downloaded again.
    assert downloads(fake_gemini) == 4
    assert elsewhere.read_bytes() == data


@pytest.fixture
def cli(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, fake_gemini: FakeGemini, capsys: Any):
    monkeypatch.chdir(tmp_path)
    for key in ("OPSTATE_STORE", "OPSTATE_TABLE_NAME", "OPSTATE_RESULTS_URL"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("GEMINI_API_KEY", KEY)
    monkeypatch.setenv("GOOGLE_GEMINI_BASE_URL", fake_gemini.base_url)
    fake_gemini.api_key = KEY
    yield in_process(monkeypatch, capsys)
    settings.cache_clear()


@pytest.mark.parametrize("escape", ["dots", "symlink"])
def test_results_download_refuses_a_location_outside_the_results_folder(
    cli: Any, fake_gemini: FakeGemini, tmp_path: Path, escape: str
) -> None:
    from opstate.store.sqlite import SQLiteStore

    data, _ = batch_output(3, {})
    file = fake_gemini.put_file("dl", body=data, expiration_time=now_text(86400))
    fake_gemini.put_batch("batches/dl", "SUCCEEDED", update_time=now_text(-60), responses_file=file)
    assert cli("track", "batches/dl")[0] == 0
    assert cli("reconcile", "--once")[0] == 0
    assert cli("archive", "--once")[0] == 0
    root = tmp_path / ".opstate" / "results"
    secret = tmp_path / "secret.txt"
    secret.write_bytes(b"someone else's")
    if escape == "dots":  # ROOT/../../secret.txt: lexically under ROOT
        location = f"{root.as_uri()}/../../secret.txt"
    else:  # a link under ROOT to a file outside it
        (root / "link.txt").symlink_to(secret)
        location = (root / "link.txt").as_uri()
    # An archive state written by an older release from a planted summary.
    store = SQLiteStore(tmp_path / ".opstate" / "ops.db")
    try:
        state = store.get_archive("batches/dl")
        assert state is not None and state.status == "archived"
        objects = [*state.summary["objects"], {"location": location, "bytes": 14, "sha256": ""}]
        forged = ArchiveState.from_dict(
            {**state.as_dict(), "summary": {**state.summary, "objects": objects}}
        )
        assert store.set_archive("batches/dl", state.rev, forged)
    finally:
        store.close()
    dest = tmp_path / "copy"
    code, _, err = cli("results", "batches/dl", "--download", str(dest))
    assert code != 0 and "outside" in err and err.count("\n") == 1, err
    assert not dest.exists() or list(dest.iterdir()) == []  # nothing written, not even the rest


# --- 3. a line without a newline: capped, the copy streams on (gzip-encoded here) -------------


def test_an_endless_gzip_line_is_one_unreadable_row_in_bounded_memory(
    fake_gemini: FakeGemini, source: GenaiSource, tmp_path: Path
) -> None:
    tail = b"".join(
        (json.dumps(row) + "\n").encode()
        for row in (ok_line("a", 1, 2), failed_line("b", 429), ok_line("c", 3, 4))
    )
    data = b"x" * (64 * MiB) + b"\n" + tail
    encoded = gzip.compress(data, compresslevel=9)
    assert len(encoded) < MiB
    digest = hashlib.sha256(data).hexdigest()
    store = MemoryStore()
    batch(
        fake_gemini,
        store,
        "batches/gz",
        data,
        body=encoded,
        content_encoding="gzip",
        declared_size=len(data),
    )
    del data
    config = Settings.from_env({"OPSTATE_RESULTS_MAX_LINE_MIB": "1"})
    sink = FileSink(tmp_path / "r")
    tracemalloc.start()
    try:
        result = archive_once(store, source, sink, settings=config)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert result.archived == 1, result
    assert peak < 32 * MiB, f"peak {peak / MiB:.0f} MiB"
    view = results_json(store, "batches/gz")
    assert view is not None
    assert view["rows"] == {
        "total": 4,
        "succeeded": 2,
        "blocked": 0,
        "failed": 1,
        "unreadable": 1,
    }
    assert view["usage"]["totalTokenCount"] == 10
    (obj,) = view["objects"]  # the stored object is the decoded bytes
    assert (obj["bytes"], obj["sha256"]) == (64 * MiB + 1 + len(tail), digest)
    stored = Path(obj["location"].removeprefix("file://"))
    sha = hashlib.sha256()
    with stored.open("rb") as handle:
        while chunk := handle.read(MiB):
            sha.update(chunk)
    assert sha.hexdigest() == digest


# --- 4. a copy shorter than Gemini declared, or not its sha256, is failed and retried -----------


def b64_hex(data: bytes) -> str:
    """sha256Hash as Gemini's files carry it: base64 of the hex digest."""
    return base64.b64encode(hashlib.sha256(data).hexdigest().encode()).decode()


@pytest.mark.parametrize("fault", ["close-delimited-cut", "short-body", "other-sha256"])
def test_a_copy_that_is_not_what_gemini_declared_is_failed_and_retried(
    fake_gemini: FakeGemini, source: GenaiSource, tmp_path: Path, fault: str
) -> None:
    clock = Clock()
    store = MemoryStore()
    data, expected = batch_output(2000, {429: 5})
    name = "batches/short"
    if fault == "close-delimited-cut":
        file = batch(fake_gemini, store, name, data, sha256_hash=b64_hex(data))
        fake_gemini.close_delimited(file)
        fake_gemini.cut(file, after=len(data) // 2)
    elif fault == "short-body":
        file = batch(fake_gemini, store, name, data[: len(data) // 2], declared_size=len(data))
    else:
        file = batch(fake_gemini, store, name, data, sha256_hash=b64_hex(b"other"))
    sink = FileSink(tmp_path / "r")
    first = archive_once(store, source, sink, settings=SETTINGS, clock_ns=clock)
    assert (first.archived, first.failed) == (0, 1), first
    state = store.get_archive(name)
    assert state is not None and state.status == "failed" and state.attempts == 1
    assert "declared" in state.last_error, state.last_error
    assert [p for p in (tmp_path / "r").rglob("*") if p.is_file()] == []  # nothing archived
    # Gemini serves the whole file next time: archived.
    fake_gemini.put_file(
        file, body=data, expiration_time=now_text(86400), sha256_hash=b64_hex(data)
    )
    clock.now += 11 * NS_PER_SECOND
    second = archive_once(store, source, sink, settings=SETTINGS, clock_ns=clock)
    assert second.archived == 1, second
    view = results_json(store, name)
    assert view is not None and view["rows"] == expected.rows


# --- 5. only well-formed file names are requested with the key ---------------------------------


@pytest.mark.parametrize(
    "responses_file", ["files/abc/../../../x", "files/abc:download?alt=media#", "files/", "../x"]
)
def test_a_malformed_output_file_name_is_never_requested(
    fake_gemini: FakeGemini, source: GenaiSource, tmp_path: Path, responses_file: str
) -> None:
    store = MemoryStore()
    fake_gemini.put_batch("batches/odd", "SUCCEEDED", responses_file=responses_file)
    t = time.time_ns()
    ingest(store, OpEvent("batches/odd", State.SUCCEEDED, t, "poll", {}), clock_ns=lambda: t)
    result = archive_once(store, source, FileSink(tmp_path / "r"), settings=SETTINGS)
    assert result.failed == 1, result
    assert {r.name for r in fake_gemini.requests} == {"batches/odd"}
    state = store.get_archive("batches/odd")
    assert state is not None and state.status == "failed"
    assert "not a Gemini file name" in state.last_error, state.last_error


# --- issue 47: one row's token count never blocks an archive ------------------------------------


@pytest.mark.parametrize(
    "count",
    ['"\u00b2"', '"' + "9" * 5000 + '"', "1e400", "-1", '"\u0663"'],
    ids=["superscript-two", "5000-digits", "float-overflow", "negative", "arabic-indic-three"],
)
def test_a_row_whose_token_count_is_no_number_is_unreadable_and_the_batch_archives(
    fake_gemini: FakeGemini, source: GenaiSource, tmp_path: Path, count: str
) -> None:
    """0.6.0 failed this archive on every attempt (``int("²")`` raised out of the ledger) until
    Gemini deleted the output: now the row is unreadable, the others are counted and priced
    as usual, and the archive is done on the first pass."""
    store = MemoryStore()
    good = json.dumps(ok_line("a", 10, 5, model="gemini-2.5-flash"))
    bad = (
        '{"key": "b", "response": {"modelVersion": "gemini-2.5-flash", "usageMetadata": '
        '{"promptTokenCount": ' + count + "}}}"
    )
    batch(fake_gemini, store, "batches/odd-count", f"{good}\n{bad}\n".encode())
    result = archive_once(store, source, FileSink(tmp_path / "r"), settings=SETTINGS)
    assert (result.archived, result.failed, result.errors) == (1, 0, 0), result
    view = results_json(store, "batches/odd-count")
    assert view is not None and view["status"] == "archived"
    assert view["rows"]["succeeded"] == 1 and view["rows"]["unreadable"] == 1
    assert view["usage"]["promptTokenCount"] == 10
