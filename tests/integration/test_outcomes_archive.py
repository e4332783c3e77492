"""Archiving end to end: a batch that succeeds on the fake Gemini, after ``opstate reconcile
--once`` and ``opstate archive --once``, is copied byte for byte (folder and S3 on moto) and
``opstate results --json`` gives the exact counts; a cut copy is never reported archived and
completes on the next pass; idempotency, concurrent archivers, deadlines, Google Cloud jobs."""

from __future__ import annotations

import hashlib
import json
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from opstate.config import Settings, settings
from opstate.domain.model import OpEvent
from opstate.domain.states import State
from opstate.domain.times import NS_PER_SECOND
from opstate.ingest import ingest
from opstate.outcomes.file_sink import FileSink
from opstate.outcomes.genai_source import GenaiSource, make_client
from opstate.outcomes.results import results_json
from opstate.outcomes.run import archive_once
from opstate.store import MemoryStore
from opstate.store.port import ArchiveState
from opstate.store.sqlite import SQLiteStore
from tests.support.cli import in_process
from tests.support.fake_gemini import FakeGemini, repeated
from tests.support.outcomes import Clock, batch_output, now_text

KEY = "test-key"
HOUR = 3600 * NS_PER_SECOND


def put_succeeded_batch(fake: FakeGemini, name: str, data: bytes, requests: int) -> str:
    file = fake.put_file(f"out-{name.split('/')[-1]}", body=data, expiration_time=now_text(86400))
    fake.put_batch(name, "SUCCEEDED", update_time=now_text(-60), responses_file=file)
    body = fake.resource(name) or {}
    body["metadata"]["batchStats"] = {"requestCount": str(requests)}
    fake.put(name, body)
    return file


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


def test_done_when_on_the_folder(cli: Any, fake_gemini: FakeGemini, tmp_path: Path) -> None:
    data, expected = batch_output(117, {429: 4, 13: 2}, unreadable=1, blocked=3)
    put_succeeded_batch(fake_gemini, "batches/b1", data, requests=130)
    assert cli("track", "batches/b1")[0] == 0
    code, out, err = cli("reconcile", "--once")
    assert code == 0, err
    code, out, err = cli("archive", "--once")
    assert code == 0, err
    assert json.loads(out) | {} == {
        "archived": 1,
        "failed": 0,
        "expired": 0,
        "none": 0,
        "bytes": len(data),
        "skipped": 0,
        "atRisk": 0,
        "errors": 0,
        "remaining": 0,
    }
    code, out, err = cli("results", "batches/b1", "--json")
    assert code == 0, err
    view = json.loads(out)
    assert set(view) == {
        "name",
        "status",
        "expiresAt",
        "archivedAt",
        "objects",
        "rows",
        "errors",
        "usage",
        "requests",
        "cost",
    }
    # These rows name no modelVersion and the batch names no model: no price, never 0.
    assert view["cost"]["usd"] is None and "no model named" in view["cost"]["reason"]
    assert view["status"] == "archived" and view["requests"] == 130
    assert view["rows"] == expected.rows and view["errors"] == expected.errors
    assert view["usage"] == expected.usage
    (obj,) = view["objects"]
    stored = Path(obj["location"].removeprefix("file://"))
    assert stored.read_bytes() == data and stored.name == "output.jsonl"
    assert (
        obj["sha256"]
        == hashlib.sha256(data).hexdigest()
        == hashlib.sha256(stored.read_bytes()).hexdigest()
    )
    assert stored.is_relative_to(tmp_path / ".opstate" / "results")
    summary = json.loads((stored.parent / "summary.json").read_text())
    assert summary["rows"] == expected.rows and summary["name"] == "batches/b1"
    # --download copies the objects and the summary.
    code, out, err = cli("results", "batches/b1", "--download", str(tmp_path / "copy"))
    assert code == 0, err
    assert (tmp_path / "copy" / "output.jsonl").read_bytes() == data
    assert (tmp_path / "copy" / "summary.json").exists()
    # The record itself never moved: same version, state; its view says where the results are.
    record = json.loads(cli("get", "batches/b1", "--json")[1])
    assert record["state"] == "SUCCEEDED" and record["version"] == 2
    assert record["results"]["status"] == "archived"
    assert record["results"]["location"] == (stored.parent / "summary.json").as_uri()
    assert record["results"]["expiresAt"] == view["expiresAt"]
    # A second pass has nothing to do.
    downloads = fake_gemini.hits("files/out-b1")
    assert json.loads(cli("archive", "--once")[1])["archived"] == 0
    assert fake_gemini.hits("files/out-b1") == downloads


def test_a_running_batch_shows_its_progress(
    cli: Any, fake_gemini: FakeGemini, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPSTATE_RECONCILE_MAX_PAGES", "0")  # polled, not discovered
    fake_gemini.put_batch("batches/run", "RUNNING", update_time=now_text(-30))
    body = fake_gemini.resource("batches/run") or {}
    body["metadata"]["batchStats"] = {
        "requestCount": "100",
        "successfulRequestCount": "40",
        "failedRequestCount": "2",
        "pendingRequestCount": "58",
    }
    fake_gemini.put("batches/run", body)
    assert cli("report", "batches/run", "RUNNING", "--time", now_text(-30))[0] == 0
    assert cli("reconcile", "--once")[0] == 0  # same state and time: the event is dropped...
    record = json.loads(cli("get", "batches/run", "--json")[1])
    assert record["state"] == "RUNNING" and "results" not in record
    assert record["version"] == 1 and "batch_stats" not in record["details"]
    assert record["progress"] == {
        "requestCount": 100,
        "successfulRequestCount": 40,
        "failedRequestCount": 2,
        "pendingRequestCount": 58,
    }  # ...its progress is kept
    code, _, err = cli("results", "batches/run", "--json")
    assert code != 0 and "no archive status" in err


def test_done_when_on_s3(
    cli: Any, fake_gemini: FakeGemini, monkeypatch: pytest.MonkeyPatch
) -> None:
    import boto3
    from moto import mock_aws

    size = 12 * 1024 * 1024 + 5  # three 5 MiB parts
    body = repeated(b'{"key": "k", "response": {"usageMetadata": {"totalTokenCount": 2}}}\n', size)
    with mock_aws():
        s3 = boto3.client("s3", region_name="us-east-1")
        s3.create_bucket(Bucket="results")
        monkeypatch.setenv("OPSTATE_RESULTS_URL", "s3://results/gemini")
        monkeypatch.setenv("OPSTATE_RESULTS_PART_MIB", "5")
        file = fake_gemini.put_file("big", body=body, size=size, expiration_time=now_text(3600))
        fake_gemini.put_batch(
            "batches/s3", "SUCCEEDED", update_time=now_text(-5), responses_file=file
        )
        assert cli("track", "batches/s3")[0] == 0
        assert cli("reconcile", "--once")[0] == 0
        code, out, err = cli("archive", "--once")
        assert code == 0, err
        assert json.loads(out)["archived"] == 1
        view = json.loads(cli("results", "batches/s3", "--json")[1])
        (obj,) = view["objects"]
        source = hashlib.sha256(b"".join(body())).hexdigest()
        assert obj["sha256"] == source and obj["bytes"] == size
        key = obj["location"].removeprefix("s3://results/")
        assert key.startswith("gemini/batches/s3/") and key.endswith("/output.jsonl")
        head = s3.head_object(Bucket="results", Key=key)
        assert head["Metadata"] == {"opstate-name": "batches/s3", "sha256": source}
        assert (
            hashlib.sha256(s3.get_object(Bucket="results", Key=key)["Body"].read()).hexdigest()
            == source
        )
        # The size cuts the last line short: one unreadable row, every other one succeeded.
        rows = view["rows"]
        assert rows["unreadable"] == 1 and rows["succeeded"] == rows["total"] - 1 > 0


# --- the run on its own ---------------------------------------------------------------------


@pytest.fixture
def source(fake_gemini: FakeGemini, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("GOOGLE_GEMINI_BASE_URL", fake_gemini.base_url)
    made = GenaiSource(make_client(Settings(gemini_api_key=KEY, results_http_timeout_s=5)))
    yield made
    made.close()


def terminal(store: MemoryStore, name: str, t_ns: int, **details: Any) -> None:
    ingest(store, OpEvent(name, State.SUCCEEDED, t_ns, "poll", details), clock_ns=lambda: t_ns)


SETTINGS = Settings(results_retry_s=10)


def test_a_cut_copy_is_never_archived_and_completes_next_pass(
    fake_gemini: FakeGemini, source: GenaiSource, tmp_path: Path
) -> None:
    clock = Clock()
    store = MemoryStore()
    size = 6 * 1024 * 1024
    body = repeated(b'{"response": {}}\n', size)
    file = fake_gemini.put_file("cut", body=body, size=size, expiration_time=now_text(86400))
    fake_gemini.put_batch("batches/cut", "SUCCEEDED", responses_file=file)
    terminal(store, "batches/cut", clock.now)
    sink = FileSink(tmp_path / "r")
    fake_gemini.cut("files/cut", after=3 * 1024 * 1024)
    first = archive_once(store, source, sink, settings=SETTINGS, clock_ns=clock)
    assert (first.archived, first.failed) == (0, 1)
    state = store.get_archive("batches/cut")
    assert state is not None and state.status == "failed" and state.attempts == 1
    assert "RemoteProtocolError" in state.last_error or "peer closed" in state.last_error
    assert [p for p in (tmp_path / "r").rglob("*") if p.is_file()] == []  # nothing left
    assert results_json(store, "batches/cut")["objects"] == []  # type: ignore[index]
    # Not due before its retry time; then whole.
    assert archive_once(store, source, sink, settings=SETTINGS, clock_ns=clock).failed == 0
    clock.now += 11 * NS_PER_SECOND
    second = archive_once(store, source, sink, settings=SETTINGS, clock_ns=clock)
    assert second.archived == 1
    view = results_json(store, "batches/cut")
    assert (
        view is not None
        and view["objects"][0]["sha256"] == hashlib.sha256(b"".join(body())).hexdigest()
    )


def test_archiving_an_archived_operation_downloads_nothing(
    fake_gemini: FakeGemini, source: GenaiSource, tmp_path: Path
) -> None:
    clock = Clock()
    store = MemoryStore()
    data, _ = batch_output(5, {})
    file = fake_gemini.put_file("idem", body=data, expiration_time=now_text(86400))
    fake_gemini.put_batch("batches/idem", "SUCCEEDED", responses_file=file)
    terminal(store, "batches/idem", clock.now)
    sink = FileSink(tmp_path / "r")
    assert archive_once(store, source, sink, settings=SETTINGS, clock_ns=clock).archived == 1
    downloads = sum(1 for r in fake_gemini.requests if r.verb == "download")
    archived = store.get_archive("batches/idem")
    assert archived is not None
    # The archive status was lost (say, a crash after summary.json): the next pass finds the
    # summary and the objects and settles it without a download.
    record = store.get("batches/idem")
    assert record is not None
    assert store.set_archive(
        "batches/idem",
        archived.rev,
        ArchiveState("pending", created_ns=record.created_ns, deadline_ns=archived.deadline_ns),
    )
    again = archive_once(store, source, sink, settings=SETTINGS, clock_ns=clock)
    assert (again.archived, again.bytes) == (1, 0)
    assert sum(1 for r in fake_gemini.requests if r.verb == "download") == downloads
    assert results_json(store, "batches/idem")["rows"] == archived.summary["rows"]  # type: ignore[index]


def test_concurrent_archivers_make_one_archive(
    fake_gemini: FakeGemini, source: GenaiSource, tmp_path: Path
) -> None:
    store = SQLiteStore(tmp_path / "ops.db")
    try:
        data, _ = batch_output(50, {})
        file = fake_gemini.put_file("conc", body=data, expiration_time=now_text(86400))
        fake_gemini.put_batch("batches/conc", "SUCCEEDED", responses_file=file)
        t = time.time_ns()
        ingest(store, OpEvent("batches/conc", State.SUCCEEDED, t, "poll", {}), clock_ns=lambda: t)
        fake_gemini.delay("files/conc", 0.3)
        sink = FileSink(tmp_path / "r")
        results: list[Any] = []

        def one() -> None:
            results.append(archive_once(store, source, sink, settings=SETTINGS))

        threads = [threading.Thread(target=one) for _ in range(3)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert sum(r.archived for r in results) == 1
        assert sum(1 for r in fake_gemini.requests if r.verb == "download") == 1
    finally:
        store.close()


def test_deadlines_previous_release_records_and_cloud_jobs(
    fake_gemini: FakeGemini, source: GenaiSource, tmp_path: Path
) -> None:
    clock = Clock()
    store = MemoryStore()
    # A record older than the retention (e.g. of the previous release): expired, no request.
    terminal(store, "batches/old", clock.now - 72 * HOUR)
    # A record still waiting whose copies fail until its deadline passes: lost.
    terminal(store, "batches/late", clock.now - 47 * HOUR)
    late_file = fake_gemini.put_file("late", body=b"{}\n", expiration_time=None)
    fake_gemini.put_batch("batches/late", "SUCCEEDED", responses_file=late_file)
    fake_gemini.fail(late_file, 503)
    # One whose file Gemini already deleted (404): lost at once.
    terminal(store, "batches/gone", clock.now)
    fake_gemini.put_batch("batches/gone", "SUCCEEDED", responses_file="files/gone")
    # A Google Cloud job: its output stays in the user's bucket.
    terminal(
        store,
        "projects/p/locations/l/batchPredictionJobs/9",
        clock.now,
        output_location="gs://bucket/out/",
    )
    # A cancelled batch with no output: none.
    fake_gemini.put_batch("batches/empty", "CANCELLED")
    terminal(store, "batches/empty", clock.now)
    sink = FileSink(tmp_path / "r")
    result = archive_once(store, source, sink, settings=SETTINGS, clock_ns=clock)
    assert (result.expired, result.none, result.failed, result.at_risk) == (2, 2, 1, 1)
    assert fake_gemini.hits("batches/old") == 0
    old = store.get_archive("batches/old")
    assert old is not None and old.status == "expired"
    cloud = store.get_archive("projects/p/locations/l/batchPredictionJobs/9")
    assert cloud is not None and cloud.status == "none" and cloud.location == "gs://bucket/out/"
    late = store.get_archive("batches/late")
    assert late is not None and late.status == "failed" and "503" in late.last_error
    gone = store.get_archive("batches/gone")
    assert gone is not None and gone.status == "expired" and "404" in gone.last_error
    clock.now += 2 * HOUR
    result = archive_once(store, source, sink, settings=SETTINGS, clock_ns=clock)
    assert result.expired == 1
    late = store.get_archive("batches/late")
    assert late is not None and late.status == "expired" and late.attempts == 1


def test_videos_filtered_videos_and_interactions_are_archived(
    fake_gemini: FakeGemini, source: GenaiSource, tmp_path: Path
) -> None:
    clock = Clock()
    store = MemoryStore()
    sink = FileSink(tmp_path / "r")
    expires = now_text(86400)
    clips = [bytes([i]) * (1000 + i) for i in range(2)]
    for i, clip in enumerate(clips):
        fake_gemini.put_file(f"clip{i}", body=clip, mime_type="video/mp4", expiration_time=expires)
    full = "models/veo-3.1-generate-preview/operations/two"
    fake_gemini.put_video(full, done=True, video_uri=f"{fake_gemini.base_url}/v1beta/files/clip0")
    body = fake_gemini.resource(full) or {}
    samples = body["response"]["generateVideoResponse"]["generatedSamples"]
    samples.append({"video": {"uri": f"{fake_gemini.base_url}/v1beta/files/clip1:download"}})
    body["response"]["generateVideoResponse"]["raiMediaFilteredCount"] = 1
    body["response"]["generateVideoResponse"]["raiMediaFilteredReasons"] = ["unsafe"]
    fake_gemini.put(full, body)
    # Every video filtered: a success with no output must say so.
    empty = "models/veo-3.1-generate-preview/operations/none"
    fake_gemini.put(
        empty,
        {
            "name": empty,
            "done": True,
            "response": {
                "generateVideoResponse": {
                    "raiMediaFilteredCount": 2,
                    "raiMediaFilteredReasons": ["celebrity", "unsafe"],
                }
            },
        },
    )
    fake_gemini.put_interaction("interactions/i9", "completed")
    for name in ("models/-/operations/two", "models/-/operations/none"):
        ingest(
            store,
            OpEvent(
                name, State.SUCCEEDED, clock.now, "poll", {"model": "veo-3.1-generate-preview"}
            ),
            clock_ns=clock,
        )
    terminal(store, "interactions/i9", clock.now)
    result = archive_once(store, source, sink, settings=SETTINGS, clock_ns=clock)
    assert (result.archived, result.failed) == (3, 0), result
    two = store.get_archive("models/-/operations/two")
    assert two is not None
    objects = two.summary["objects"]
    assert [o["location"].rsplit("/", 1)[-1] for o in objects] == ["video-0.mp4", "video-1.mp4"]
    assert [o["sha256"] for o in objects] == [hashlib.sha256(c).hexdigest() for c in clips]
    assert two.summary["videos"] == {"count": 2, "filteredCount": 1, "filteredReasons": ["unsafe"]}
    assert two.summary["rows"] is None and results_json(store, "models/-/operations/two")
    none = store.get_archive("models/-/operations/none")
    assert none is not None and none.status == "archived" and none.summary["objects"] == []
    assert none.summary["videos"] == {
        "count": 0,
        "filteredCount": 2,
        "filteredReasons": ["celebrity", "unsafe"],
    }
    interaction = store.get_archive("interactions/i9")
    assert interaction is not None
    (obj,) = interaction.summary["objects"]
    document = json.loads(Path(obj["location"].removeprefix("file://")).read_text())
    assert document["status"] == "completed"


def test_a_bus_trigger_archives_the_operation_it_names_only(
    fake_gemini: FakeGemini, source: GenaiSource, tmp_path: Path
) -> None:
    from opstate.outcomes.wiring import names_of

    clock = Clock()
    store = MemoryStore()
    for name in ("batches/named", "batches/other"):
        data, _ = batch_output(3, {})
        file = fake_gemini.put_file(name.split("/")[1], body=data, expiration_time=now_text(9999))
        fake_gemini.put_batch(name, "SUCCEEDED", responses_file=file)
        terminal(store, name, clock.now)
    trigger = {
        "source": "gemini-opstate",
        "detail-type": "Operation State Changed",
        "detail": {"name": "batches/named", "state": "SUCCEEDED"},
    }
    names = names_of(trigger)
    assert names == ["batches/named"]
    assert names_of({"source": "gemini-opstate.reconcile"}) is None
    sink = FileSink(tmp_path / "r")
    result = archive_once(store, source, sink, settings=SETTINGS, clock_ns=clock, names=names)
    assert result.archived == 1
    assert store.get_archive("batches/other") is None  # left for its own trigger or a pass
    again = archive_once(store, source, sink, settings=SETTINGS, clock_ns=clock, names=names)
    assert again.archived == 0  # settled: nothing to do
