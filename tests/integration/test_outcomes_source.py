"""The Gemini source on the real google-genai client against the fake Gemini: what each kind
left, its expirationTime and batchStats, and streaming downloads (also cut mid-stream, 5xx,
404 after expiry)."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from typing import Any

import pytest

from opstate.config import Settings
from opstate.domain.model import OpRecord
from opstate.domain.states import State
from opstate.domain.times import parse_time
from opstate.outcomes.genai_source import GenaiSource, make_client
from opstate.outcomes.ledger import BatchLedger
from opstate.outcomes.source import BATCH_OUTPUT, VIDEO, SourceError
from tests.support.fake_gemini import FakeGemini, repeated
from tests.support.outcomes import batch_output

API_KEY = "test-key"


@pytest.fixture
def source(fake_gemini: FakeGemini, monkeypatch: pytest.MonkeyPatch) -> Iterator[GenaiSource]:
    fake_gemini.api_key = API_KEY
    monkeypatch.setenv("GOOGLE_GEMINI_BASE_URL", fake_gemini.base_url)
    made = GenaiSource(make_client(Settings(gemini_api_key=API_KEY, results_http_timeout_s=5)))
    yield made
    made.close()


def record(name: str, **details: Any) -> OpRecord:
    return OpRecord(name, State.SUCCEEDED, parse_time("2026-05-01T10:00:00Z"), 2, "poll", details)


def test_a_batch_file_output_streams_with_its_deadline_and_request_count(
    fake_gemini: FakeGemini, source: GenaiSource
) -> None:
    data, expected = batch_output(40, {429: 3, 500: 1}, unreadable=1)
    file = fake_gemini.put_file("out1", body=data, expiration_time="2026-05-03T10:00:00Z")
    body = dict(fake_gemini.resource("batches/b1") or {})
    fake_gemini.put_batch("batches/b1", "SUCCEEDED", responses_file=file)
    body = fake_gemini.resource("batches/b1") or {}
    body["metadata"]["batchStats"] = {"requestCount": "45", "successfulRequestCount": "40"}
    fake_gemini.put("batches/b1", body)
    outputs = source.outputs(record("batches/b1"))
    assert outputs.requests == 45
    assert outputs.expiration_ns == parse_time("2026-05-03T10:00:00Z")
    (item,) = outputs.items
    assert (item.key, item.what, item.file) == ("output.jsonl", BATCH_OUTPUT, "files/out1")
    ledger = BatchLedger()
    source.download("files/out1", ledger)
    ledger.finish()
    assert ledger.sha256 == hashlib.sha256(data).hexdigest()
    assert ledger.rows.as_dict() == expected.rows and ledger.errors == expected.errors


def test_a_download_cut_mid_stream_or_refused_is_a_source_error(
    fake_gemini: FakeGemini, source: GenaiSource
) -> None:
    size = 5 * 1024 * 1024
    fake_gemini.put_file("big", body=repeated(b"0123456789abcdef", size), size=size)
    fake_gemini.cut("files/big", after=2 * 1024 * 1024)
    got = BatchLedger()
    with pytest.raises(SourceError) as cut:
        source.download("files/big", got)
    assert cut.value.transient and got.size < size
    whole = BatchLedger()
    source.download("files/big", whole)  # the next attempt is whole
    assert whole.size == size
    fake_gemini.fail("files/big", 503, times=1)
    with pytest.raises(SourceError) as refused:
        source.download("files/big", BatchLedger())
    assert refused.value.status == 503 and refused.value.transient
    fake_gemini.expire_file("files/big")
    with pytest.raises(SourceError) as gone:
        source.download("files/big", BatchLedger())
    assert gone.value.not_found and not gone.value.transient


def test_inlined_responses_become_jsonl_in_request_order(
    fake_gemini: FakeGemini, source: GenaiSource
) -> None:
    fake_gemini.put_batch("batches/in", "SUCCEEDED")
    body = fake_gemini.resource("batches/in") or {}
    body["metadata"]["output"] = {
        "inlinedResponses": {
            "inlinedResponses": [
                {"response": {"usageMetadata": {"totalTokenCount": 3}}, "metadata": {"key": "a"}},
                {"error": {"code": 3, "message": "bad"}, "metadata": {"key": "b"}},
            ]
        }
    }
    fake_gemini.put("batches/in", body)
    (item,) = source.outputs(record("batches/in")).items
    assert item.data is not None and item.file is None
    ledger = BatchLedger()
    ledger.feed(item.data)
    ledger.finish()
    # the response has no candidates: it carries no answer (blocked, among the succeeded)
    assert ledger.rows.as_dict() == {
        "total": 2,
        "succeeded": 1,
        "blocked": 1,
        "failed": 1,
        "unreadable": 0,
    }
    assert ledger.errors == {"3": 1} and ledger.usage["totalTokenCount"] == 3


def test_videos_and_their_filtered_outcomes(fake_gemini: FakeGemini, source: GenaiSource) -> None:
    fake_gemini.put_file("vid0", body=b"\x00mp4" * 100, mime_type="video/mp4")
    uri = f"{fake_gemini.base_url}/v1beta/files/vid0:download?alt=media"
    name = "models/veo-3.1-generate-preview/operations/v1"
    fake_gemini.put_video(name, done=True, video_uri=uri)
    body = fake_gemini.resource(name) or {}
    body["response"]["generateVideoResponse"].update(
        raiMediaFilteredCount=1, raiMediaFilteredReasons=["celebrity"]
    )
    fake_gemini.put(name, body)
    rec = record("models/-/operations/v1", model="veo-3.1-generate-preview")
    outputs = source.outputs(rec)
    (item,) = outputs.items
    assert (item.key, item.what, item.file) == ("video-0.mp4", VIDEO, "files/vid0")
    assert outputs.filtered_count == 1 and outputs.filtered_reasons == ("celebrity",)
    assert outputs.expiration_ns == parse_time("2026-05-03T10:00:00Z")


def test_an_interaction_is_its_final_resource(fake_gemini: FakeGemini, source: GenaiSource) -> None:
    fake_gemini.put_interaction("interactions/i1", "completed")
    (item,) = source.outputs(record("interactions/i1")).items
    assert item.key == "interaction.json" and item.data is not None
    assert b'"completed"' in item.data
    assert source.outputs(record("fileSearchStores/s/operations/o")).items == ()
