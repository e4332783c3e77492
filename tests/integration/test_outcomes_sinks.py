"""The sinks: an object is visible only when whole (folder: temp name + rename; S3: multipart
upload to a temporary key, aborted on failure, copied into place with name and sha256)."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest

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
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket=BUCKET).get("Contents", [])]
    assert keys == ["prefix/batches/a/1/output.jsonl"]  # the temporary object is gone
    assert sink.head("batches/a/1/output.jsonl") == stored


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
        with pytest.raises(SinkError) as caught, sink.open("k", name="n"):
            pass
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
