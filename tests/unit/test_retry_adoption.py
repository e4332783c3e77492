"""What a found batch must show to be adopted as a retry child or a submitted root (issue 47,
``opstate.retry.adoption``), and what Gemini is shown of a child's id (``lineage.public_name``).
"""

from __future__ import annotations

import base64
import hashlib
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from opstate.gemini.errors import GatewayError
from opstate.retry import lineage
from opstate.retry.acting import Job
from opstate.retry.adoption import Claim, model_id, refusal

NOW = 1_780_000_000_000_000_000
UPLOAD = "files/ours"
BYTES = b'{"key": "a", "request": {}}\n'
SHA = hashlib.sha256(BYTES).hexdigest()


def job(**kw: Any) -> Job:
    fields: dict[str, Any] = {
        "name": "batches/x",
        "event": None,
        "model": "models/gemini-2.5-flash",
        "display_name": "anything",
        "created_ns": NOW + 1,
        "input_file": UPLOAD,
    }
    return Job(**(fields | kw))


class Files:
    """``client.files.get`` of one uploaded file (Gemini's sha256Hash: base64 of the hex)."""

    def __init__(self, data: bytes | None) -> None:
        self.data = data
        self.asked: list[str] = []

    def get(self, *, name: str) -> Any:
        self.asked.append(name)
        if self.data is None:
            raise GatewayError("not found", status=404)
        digest = base64.b64encode(hashlib.sha256(self.data).hexdigest().encode()).decode()
        return SimpleNamespace(size_bytes=len(self.data), sha256_hash=digest, expiration_time=None)


def client(data: bytes | None = BYTES) -> Any:
    return SimpleNamespace(files=Files(data))


CLAIM = Claim(UPLOAD, "gemini-2.5-flash", NOW)


def test_a_job_on_the_recorded_upload_and_model_created_after_the_claim_is_adopted() -> None:
    asked = client()
    assert refusal(asked, job(), CLAIM) is None
    assert asked.files.asked == []  # the store's record is the evidence: no extra read


@pytest.mark.parametrize(
    ("found", "why"),
    [
        (job(input_file="files/theirs"), "is not the upload"),
        (job(input_file=""), "is not the upload"),
        (job(model="models/gemini-2.5-pro"), "runs on"),
        (job(model=None), "runs on"),
        (job(created_ns=NOW), "before the claim"),
        (job(created_ns=NOW - 1), "before the claim"),
        (job(created_ns=None), "before the claim"),
    ],
)
def test_anything_else_is_refused_with_the_reason(found: Job, why: str) -> None:
    said = refusal(client(), found, CLAIM)
    assert said is not None and why in said


def test_a_claim_of_the_previous_release_needs_the_planned_bytes() -> None:
    legacy = Claim(None, None, None, SHA)
    assert refusal(client(BYTES), job(input_file="files/old"), legacy) is None
    other = refusal(client(b"other bytes\n"), job(input_file="files/old"), legacy)
    assert other is not None and "does not hold the planned input" in other
    gone = refusal(client(None), job(input_file="files/old"), legacy)
    assert gone is not None and "gone" in gone
    assert refusal(client(), job(), Claim(None, None, None, None)) is not None
    assert refusal(client(), job(input_file=""), legacy) is not None


def test_a_record_a_bucket_writer_may_reach_is_checked_against_the_bytes_too() -> None:
    kept = Claim(UPLOAD, "gemini-2.5-flash", NOW, SHA)
    assert refusal(client(BYTES), job(), kept) is None
    assert refusal(client(b"planted\n"), job(), kept) is not None


def test_a_failed_read_of_the_input_file_is_no_verdict() -> None:
    class Broken:
        def get(self, *, name: str) -> Any:
            raise GatewayError("unavailable", status=503, transient=True)

    with pytest.raises(GatewayError):
        refusal(SimpleNamespace(files=Broken()), job(), Claim(None, None, None, SHA))


def test_model_ids_compare_with_or_without_the_models_prefix() -> None:
    assert model_id("models/gemini-2.5-flash") == model_id("gemini-2.5-flash")
    assert model_id(None) == ""


@given(st.integers(0, 20), st.integers(0, 500))
def test_the_public_name_holds_no_part_of_the_nonce(attempt: int, index: int) -> None:
    child, nonce = lineage.new_child_id(attempt, index)
    shown = lineage.public_name(child)
    assert shown.startswith("opstate-retry-") and shown.endswith(f"-a{attempt}-{index}")
    tag = shown.removeprefix("opstate-retry-").split("-")[0]
    assert len(tag) == 12 and tag not in nonce
    assert not any(nonce[i : i + 8] in shown for i in range(len(nonce) - 7))
    assert lineage.public_name(child) == shown  # the same entry, the same name
