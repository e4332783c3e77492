"""The sinks: an object is visible only when whole (folder: temp name + rename; S3: one
PutObject for an object in one part, a multipart upload onto the key when its sha256 is known
first, else to a temporary key copied into place; aborted on failure), with name and sha256.

What S3 promises, from AWS's documentation:
- CopyObject (https://docs.aws.amazon.com/AmazonS3/latest/API/API_CopyObject.html): "You
  create a copy of your object up to 5 GB in size in a single atomic action using this API.
  However, to copy an object greater than 5 GB, you must use the multipart upload Upload Part
  - Copy (UploadPartCopy) API."
- Multipart upload (S3 User Guide, "Uploading and copying objects using multipart upload",
  https://docs.aws.amazon.com/AmazonS3/latest/userguide/mpuoverview.html): "If you want to
  provide any metadata describing the object being uploaded, you must provide it in the
  request to initiate multipart upload", and on completion "Amazon S3 creates an object by
  concatenating the parts": until then there is no object under the key.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest

from opstate.outcomes import s3_sink
from opstate.outcomes.file_sink import FileSink
from opstate.outcomes.s3_sink import MIN_PART_SIZE, S3Sink
from opstate.outcomes.sink import SinkError, download
from opstate.private_files import open_private_dir

BUCKET = "results"


class Cut(Exception):
    pass


@pytest.fixture
def s3() -> Iterator[object]:
    from moto import mock_aws

    with mock_aws():
        client = boto3.client("s3", region_name="us-east-1")
        client.create_bucket(Bucket=BUCKET)
        yield client


def calls_of(client: Any) -> list[str]:
    """The S3 operations ``client`` makes from now on, in order (a botocore hook)."""
    made: list[str] = []

    def seen(model: Any, **_: Any) -> None:
        made.append(model.name)

    client.meta.events.register("before-call.s3", seen)
    return made


def download_to(sink: Any, location: str, path: Path) -> int:
    """``download`` into ``path``'s folder as the CLI does (issue 47: a private folder opened
    once, the file written relative to its descriptor)."""
    folder = open_private_dir(path.parent, "the download folder")
    try:
        return download(sink, location, folder, path.name)
    finally:
        os.close(folder)


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def test_folder_sink_writes_whole_objects_or_nothing(tmp_path: Path) -> None:
    sink = FileSink(tmp_path / "results")
    data = os.urandom(3 * 1024 * 1024 + 7)
    with sink.open("batches/a/1/output.jsonl", name="batches/a") as out:
        for i in range(0, len(data), 1 << 20):
            out.write(data[i : i + (1 << 20)])
        stored = out.commit(sha(data))
    assert stored.size == len(data) and stored.location.startswith("file://")
    assert (tmp_path / "results/batches/a/1/output.jsonl").read_bytes() == data
    assert sink.head("batches/a/1/output.jsonl") == stored.__class__(stored.location, len(data), "")
    with pytest.raises(Cut), sink.open("batches/b/1/output.jsonl", name="batches/b") as out:
        out.write(b"half")
        raise Cut
    assert sink.head("batches/b/1/output.jsonl") is None
    assert list((tmp_path / "results/batches/b/1").iterdir()) == []  # no temporary file left
    copy = tmp_path / "copy.jsonl"
    assert download_to(sink, stored.location, copy) == len(data) and copy.read_bytes() == data
    with pytest.raises(SinkError):
        sink.path("../escape")


def test_s3_sink_streams_multipart_and_sets_name_and_sha256(s3) -> None:  # type: ignore[no-untyped-def]
    sink = S3Sink(BUCKET, "prefix/", client=s3, part_size=MIN_PART_SIZE)
    data = os.urandom(2 * MIN_PART_SIZE + 12345)
    peak = 0
    made = calls_of(s3)
    with sink.open("batches/a/1/output.jsonl", name="batches/a") as out:
        for i in range(0, len(data), 1 << 20):
            out.write(data[i : i + (1 << 20)])
            peak = max(peak, len(out.buffer))
        stored = out.commit(sha(data))
        assert len(out.parts) == 3
    assert peak < MIN_PART_SIZE  # memory bounded by the part size, not the object
    assert stored.location == "s3://results/prefix/batches/a/1/output.jsonl"
    head = s3.head_object(Bucket=BUCKET, Key="prefix/batches/a/1/output.jsonl")
    assert head["Metadata"] == {"opstate-name": "batches/a", "sha256": sha(data)}
    assert head["ContentLength"] == len(data)
    body = s3.get_object(Bucket=BUCKET, Key="prefix/batches/a/1/output.jsonl")["Body"].read()
    assert sha(body) == sha(data)
    # Its sha256 known only at the end: a temporary upload, one CopyObject, the temporary gone.
    assert made[:6] == [
        "CreateMultipartUpload",
        "UploadPart",
        "UploadPart",
        "UploadPart",
        "CompleteMultipartUpload",
        "CopyObject",
    ]
    assert made[6] == "DeleteObject"
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket=BUCKET).get("Contents", [])]
    assert keys == ["prefix/batches/a/1/output.jsonl"]  # the temporary object is gone
    assert sink.head("batches/a/1/output.jsonl") == stored


def test_s3_sink_puts_an_object_of_one_part_in_one_request(s3) -> None:  # type: ignore[no-untyped-def]
    sink = S3Sink(BUCKET, "prefix", client=s3, part_size=MIN_PART_SIZE)
    data = b'{"name": "batches/a"}'
    made = calls_of(s3)
    with sink.open("batches/a/1/summary.json", name="batches/a") as out:
        out.write(data)
        assert made == []  # nothing is sent before the commit
        stored = out.commit(sha(data))
    assert made == ["PutObject"]
    head = s3.head_object(Bucket=BUCKET, Key="prefix/batches/a/1/summary.json")
    assert head["Metadata"] == {"opstate-name": "batches/a", "sha256": sha(data)}
    assert head["ContentType"] == "application/json"
    assert sink.head("batches/a/1/summary.json") == stored
    # Just under a part, and an empty object: one request each.
    made.clear()
    big = os.urandom(MIN_PART_SIZE - 1)
    with sink.open("b/1/output.jsonl", name="b", sha256=sha(big)) as out:
        out.write(big)
        out.commit(sha(big))
    with sink.open("c/1/output.jsonl", name="c") as out:
        out.commit(sha(b""))
    assert made == ["PutObject"] * 2
    assert sink.read("c/1/output.jsonl", 10) == b""
    assert s3.get_object(Bucket=BUCKET, Key="prefix/b/1/output.jsonl")["Body"].read() == big


def test_s3_sink_writes_straight_to_the_key_when_the_sha256_is_known(s3) -> None:  # type: ignore[no-untyped-def]
    sink = S3Sink(BUCKET, "prefix", client=s3, part_size=MIN_PART_SIZE)
    data = os.urandom(MIN_PART_SIZE + 99)
    made = calls_of(s3)
    with sink.open("batches/a/1/output.jsonl", name="batches/a", sha256=sha(data)) as out:
        out.write(data)
        uploads = s3.list_multipart_uploads(Bucket=BUCKET)["Uploads"]
        assert [u["Key"] for u in uploads] == ["prefix/batches/a/1/output.jsonl"]
        stored = out.commit(sha(data))
    assert [m for m in made if m != "ListMultipartUploads"] == [
        "CreateMultipartUpload",
        "UploadPart",
        "UploadPart",
        "CompleteMultipartUpload",
    ]
    head = s3.head_object(Bucket=BUCKET, Key="prefix/batches/a/1/output.jsonl")
    assert head["Metadata"] == {"opstate-name": "batches/a", "sha256": sha(data)}
    assert head["ContentType"] == "application/jsonl" and head["ContentLength"] == len(data)
    assert sink.head("batches/a/1/output.jsonl") == stored
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket=BUCKET).get("Contents", [])]
    assert keys == ["prefix/batches/a/1/output.jsonl"]  # no temporary object at any time


def test_s3_sink_refuses_bytes_other_than_the_sha256_it_was_given(s3) -> None:  # type: ignore[no-untyped-def]
    sink = S3Sink(BUCKET, "prefix", client=s3, part_size=MIN_PART_SIZE)
    old = b"the earlier copy"
    with sink.open("batches/a/1/output.jsonl", name="batches/a") as out:
        out.write(old)
        out.commit(sha(old))
    declared = sha(b"what Gemini declared")
    for data in (b"small and wrong", os.urandom(MIN_PART_SIZE + 1)):  # one request, multipart
        with (
            pytest.raises(SinkError, match="was to have sha256") as caught,
            sink.open("batches/a/1/output.jsonl", name="batches/a", sha256=declared) as out,
        ):
            out.write(data)
            out.commit(sha(data))
        assert not caught.value.transient
        # Nothing replaced the earlier copy, no upload is left open.
        assert sink.read("batches/a/1/output.jsonl", 100) == old
        assert s3.list_multipart_uploads(Bucket=BUCKET).get("Uploads", []) == []


def test_s3_sink_aborts_a_cut_upload_onto_the_key_and_keeps_the_earlier_copy(s3) -> None:  # type: ignore[no-untyped-def]
    sink = S3Sink(BUCKET, "p", client=s3, part_size=MIN_PART_SIZE)
    with sink.open("batches/a/1/output.jsonl", name="batches/a") as out:
        out.write(b"earlier")
        out.commit(sha(b"earlier"))
    data = os.urandom(MIN_PART_SIZE + 10)
    with (
        pytest.raises(Cut),
        sink.open("batches/a/1/output.jsonl", name="batches/a", sha256=sha(data)) as out,
    ):
        out.write(data)  # one part already uploaded onto the key
        raise Cut
    assert s3.list_multipart_uploads(Bucket=BUCKET).get("Uploads", []) == []
    assert sink.read("batches/a/1/output.jsonl", 100) == b"earlier"


def test_s3_sink_copies_a_large_object_in_parts_above_the_one_request_limit(  # type: ignore[no-untyped-def]
    s3, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(s3_sink, "COPY_ONE_REQUEST_MAX", MIN_PART_SIZE)
    sink = S3Sink(BUCKET, "prefix", client=s3, part_size=MIN_PART_SIZE)
    data = os.urandom(2 * MIN_PART_SIZE)
    made = calls_of(s3)
    with sink.open("v/1/video.mp4", name="v") as out:
        out.write(data)
        out.commit(sha(data))
    assert "CopyObject" not in made and "UploadPartCopy" in made  # boto3's managed copy
    head = s3.head_object(Bucket=BUCKET, Key="prefix/v/1/video.mp4")
    assert head["Metadata"] == {"opstate-name": "v", "sha256": sha(data)}
    assert head["ContentType"] == "video/mp4"
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket=BUCKET).get("Contents", [])]
    assert keys == ["prefix/v/1/video.mp4"]


def test_s3_sink_aborts_a_cut_upload(s3, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    sink = S3Sink(BUCKET, "p", client=s3, part_size=MIN_PART_SIZE)
    with pytest.raises(Cut), sink.open("batches/a/1/output.jsonl", name="batches/a") as out:
        out.write(os.urandom(MIN_PART_SIZE + 10))  # one part already uploaded
        raise Cut
    assert s3.list_objects_v2(Bucket=BUCKET).get("Contents", []) == []
    assert s3.list_multipart_uploads(Bucket=BUCKET).get("Uploads", []) == []
    assert sink.head("batches/a/1/output.jsonl") is None
    assert sink.read("batches/a/1/summary.json", 100) is None
    with sink.open("x/summary.json", name="x") as out:
        out.write(b"{}")
        stored = out.commit(sha(b"{}"))
    assert sink.read("x/summary.json", 100) == b"{}"
    assert download_to(sink, stored.location, tmp_path / "s.json") == 2


def test_s3_sink_names_a_missing_bucket() -> None:
    from moto import mock_aws

    with mock_aws():
        sink = S3Sink("absent", client=boto3.client("s3", region_name="us-east-1"))
        with pytest.raises(SinkError) as caught, sink.open("k", name="n") as out:
            out.commit(sha(b""))
        assert "NoSuchBucket" in str(caught.value) and not caught.value.transient


def test_folder_sink_reads_and_writes_only_under_its_root(tmp_path: Path) -> None:
    root = tmp_path / "results"
    sink = FileSink(root)
    with sink.open("batches/a/1/output.jsonl", name="batches/a") as out:
        out.write(b"mine")
        stored = out.commit(sha(b"mine"))
    secret = tmp_path / "secret.txt"
    secret.write_bytes(b"not the results")
    (root / "batches/a/1/link.txt").symlink_to(secret)
    outside = [
        f"{root.as_uri()}/../secret.txt",  # lexically under the root
        f"{root.as_uri()}/batches/a/1/../../../../secret.txt",
        (root / "batches/a/1/link.txt").as_uri(),  # a link out of the root
        secret.as_uri(),
        root.as_uri(),  # the root itself is no object
        "file://elsewhere.example/results/batches/a/1/output.jsonl",
        "s3://results/batches/a/1/output.jsonl",
        "results/batches/a/1/output.jsonl",
    ]
    for location in outside:
        with pytest.raises(SinkError) as caught:
            list(sink.chunks(location))
        assert not caught.value.transient, location
        with pytest.raises(SinkError):
            download_to(sink, location, tmp_path / "copy" / "x")
    assert not (tmp_path / "copy" / "x").exists()
    # By key: a link out is no object (read, head), and a folder leading out is never written.
    (root / "batches/a/1/summary.json").symlink_to(secret)
    assert sink.read("batches/a/1/summary.json", 100) is None
    assert sink.head("batches/a/1/link.txt") is None
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (root / "batches/b").symlink_to(elsewhere)
    with pytest.raises(SinkError, match="outside"), sink.open("batches/b/1/x", name="batches/b"):
        pass
    assert list(elsewhere.iterdir()) == []
    assert sink.resolve(stored.location) == "batches/a/1/output.jsonl"
    assert b"".join(sink.chunks(stored.location)) == b"mine"


def test_s3_sink_reads_only_under_its_prefix(s3) -> None:  # type: ignore[no-untyped-def]
    sink = S3Sink(BUCKET, "prefix", client=s3)
    with sink.open("batches/a/1/output.jsonl", name="batches/a") as out:
        out.write(b"mine")
        stored = out.commit(sha(b"mine"))
    s3.put_object(Bucket=BUCKET, Key="other/secret.txt", Body=b"not the results")
    s3.create_bucket(Bucket="another")
    s3.put_object(Bucket="another", Key="prefix/secret.txt", Body=b"not the results")
    outside = [
        f"s3://{BUCKET}/other/secret.txt",  # another prefix
        f"s3://{BUCKET}/prefixx/secret.txt",
        f"s3://{BUCKET}/prefix/../other/secret.txt",
        f"s3://{BUCKET}/prefix//secret.txt",
        f"s3://{BUCKET}/prefix/",
        "s3://another/prefix/secret.txt",  # another bucket
        f"file:///{BUCKET}/prefix/secret.txt",
    ]
    for location in outside:
        with pytest.raises(SinkError) as caught:
            list(sink.chunks(location))
        assert not caught.value.transient and "outside" in str(caught.value), location
    assert sink.resolve(stored.location) == "batches/a/1/output.jsonl"
    assert b"".join(sink.chunks(stored.location)) == b"mine"


def test_folder_sink_refuses_bytes_other_than_the_sha256_it_was_given(tmp_path: Path) -> None:
    sink = FileSink(tmp_path / "results")
    with sink.open("a/output.jsonl", name="a") as out:
        out.write(b"earlier")
        out.commit(sha(b"earlier"))
    with (
        pytest.raises(SinkError, match="was to have sha256") as caught,
        sink.open("a/output.jsonl", name="a", sha256=sha(b"declared")) as out,
    ):
        out.write(b"other")
        out.commit(sha(b"other"))
    assert not caught.value.transient
    assert sink.read("a/output.jsonl", 100) == b"earlier"
    assert sorted(p.name for p in (tmp_path / "results/a").iterdir()) == ["output.jsonl"]
