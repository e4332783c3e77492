"""Keeping a batch's input (opstate.retry.inputs): checked line by line, copied into the
results sink under its sha256 (a folder, and S3 on moto), reused when already there, refused
whole (nothing written) when a line is bad or the source changes between the two passes; and
read back by key."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import boto3
import pytest

from opstate.outcomes.file_sink import FileSink
from opstate.outcomes.s3_sink import S3Sink
from opstate.outcomes.sink import ObjectWriter, Sink, SinkError, StoredObject
from opstate.retry.inputs import (
    MAX_KEY_CHARS,
    InputError,
    check_input,
    input_key,
    keep_input,
    keys_cover,
    source_chunks,
    subset,
)

BUCKET = "results"
CAP = 4096


def request_line(key: str, size: int = 40) -> bytes:
    text = "x" * size
    return json.dumps({"key": key, "request": {"contents": [{"parts": [{"text": text}]}]}}).encode()


GOOD = b"\n".join(request_line(f"k{i}") for i in range(5)) + b"\n"


def chunked(data: bytes, size: int = 13) -> Callable[[], Iterator[bytes]]:
    return lambda: iter([data[i : i + size] for i in range(0, len(data), size)])


def files_under(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file()) if root.exists() else []


@pytest.fixture
def s3() -> Iterator[Any]:
    from moto import mock_aws

    with mock_aws():
        client = boto3.client("s3", region_name="us-east-1")
        client.create_bucket(Bucket=BUCKET)
        yield client


class CountingSink:
    """A sink that counts the objects opened for writing (and forwards everything)."""

    def __init__(self, sink: Sink) -> None:
        self.sink = sink
        self.url = sink.url
        self.opened = 0

    def open(
        self, key: str, *, name: str, sha256: str = ""
    ) -> AbstractContextManager[ObjectWriter]:
        self.opened += 1
        return self.sink.open(key, name=name, sha256=sha256)

    def head(self, key: str) -> StoredObject | None:
        return self.sink.head(key)

    def read(self, key: str, limit: int) -> bytes | None:
        return self.sink.read(key, limit)

    def resolve(self, location: str) -> str:
        return self.sink.resolve(location)

    def chunks(self, location: str) -> Iterator[bytes]:
        return self.sink.chunks(location)

    def location(self, key: str) -> str:
        return self.sink.location(key)


def test_a_good_input_is_kept_in_a_folder_and_reused(tmp_path: Path) -> None:
    sink = CountingSink(FileSink(tmp_path / "results"))
    sha = hashlib.sha256(GOOD).hexdigest()
    kept = keep_input(chunked(GOOD), sink, CAP, name="batches/a")
    assert kept.as_dict() == {
        "location": (tmp_path / "results" / "inputs" / sha / "input.jsonl").as_uri(),
        "sha256": sha,
        "rows": 5,
        "bytes": len(GOOD),
    }
    assert b"".join(sink.chunks(kept.location)) == GOOD
    assert sink.opened == 1
    again = keep_input(chunked(GOOD, 1000), sink, CAP)
    assert again == kept and sink.opened == 1  # already there: not rewritten
    assert files_under(tmp_path / "results") == [tmp_path / "results" / input_key(sha)]


def test_a_good_input_is_kept_in_s3_with_its_sha256_and_reused(s3: Any) -> None:
    sink = CountingSink(S3Sink(BUCKET, "pre", client=s3))
    sha = hashlib.sha256(GOOD).hexdigest()
    kept = keep_input(chunked(GOOD), sink, CAP, name="batches/a")
    assert kept.location == f"s3://{BUCKET}/pre/inputs/{sha}/input.jsonl"
    stored = s3.get_object(Bucket=BUCKET, Key=f"pre/inputs/{sha}/input.jsonl")
    assert stored["Body"].read() == GOOD
    assert sink.head(input_key(sha)) == StoredObject(kept.location, len(GOOD), sha)
    assert keep_input(chunked(GOOD), sink, CAP) == kept and sink.opened == 1


def test_an_object_of_another_size_under_the_key_is_replaced(tmp_path: Path) -> None:
    sink = FileSink(tmp_path / "results")
    sha = hashlib.sha256(GOOD).hexdigest()
    (tmp_path / "results" / "inputs" / sha).mkdir(parents=True)
    (tmp_path / "results" / input_key(sha)).write_bytes(b"torn")
    kept = keep_input(chunked(GOOD), sink, CAP)
    assert (tmp_path / "results" / input_key(sha)).read_bytes() == GOOD and kept.rows == 5


LONG_KEY = "k" * (MAX_KEY_CHARS + 1)


@pytest.mark.parametrize(
    ("bad", "what"),
    [
        (b"\xff\xfe not utf-8", "not UTF-8"),
        (b'{"key": "x", "request": {}', "not JSON"),
        (b'{"key": "x", "request": {"n": NaN}}', "not JSON"),
        (b'["key", "request"]', "not a JSON object"),
        (b'{"request": {}}', 'no "key"'),
        (b'{"key": "", "request": {}}', 'no "key"'),
        (b'{"key": 7, "request": {}}', 'no "key"'),
        (json.dumps({"key": LONG_KEY, "request": {}}).encode(), "longer than 512 characters"),
        (b'{"key": "x"}', 'no "request" object'),
        (b'{"key": "x", "request": "text"}', 'no "request" object'),
        (b"   ", "blank line"),
        (b"", "blank line"),
        (request_line("x", CAP), f"longer than {CAP} bytes"),
        (request_line("k1"), "key 'k1' was seen on an earlier line"),
    ],
)
def test_every_bad_line_is_named_and_nothing_is_written(
    tmp_path: Path, bad: bytes, what: str
) -> None:
    data = request_line("k0") + b"\n" + request_line("k1") + b"\n" + bad + b"\n" + GOOD
    sink = FileSink(tmp_path / "results")
    with pytest.raises(InputError) as caught:
        keep_input(chunked(data, 7), sink, CAP)
    assert caught.value.line == 3
    assert str(caught.value).startswith("input line 3: ") and what in str(caught.value)
    assert files_under(tmp_path / "results") == []


def test_endings_and_an_empty_input() -> None:
    crlf = GOOD.replace(b"\n", b"\r\n")
    assert check_input(iter([crlf]), CAP).rows == 5
    assert check_input(iter([GOOD.rstrip(b"\n")]), CAP).rows == 5  # no final newline
    with pytest.raises(InputError, match="input line 6: blank line"):
        check_input(iter([GOOD + b"\n"]), CAP)  # two final newlines
    with pytest.raises(InputError, match="no request") as caught:
        check_input(iter([b""]), CAP)
    assert caught.value.line is None


def test_a_source_that_changes_between_passes_is_refused(tmp_path: Path) -> None:
    sink = FileSink(tmp_path / "results")
    reads = [GOOD, GOOD.replace(b"xxxx", b"yyyy", 1)]

    def source() -> Iterable[bytes]:
        return [reads.pop(0)]

    with pytest.raises(InputError, match="changed while it was being kept"):
        keep_input(source, sink, CAP)
    assert files_under(tmp_path / "results") == []
    grows = [GOOD, GOOD + request_line("extra")]
    with pytest.raises(InputError, match="changed"):
        keep_input(lambda: [grows.pop(0)], sink, CAP)
    assert files_under(tmp_path / "results") == []


def test_sources_file_and_s3(tmp_path: Path, s3: Any) -> None:
    path = tmp_path / "in put.jsonl"
    path.write_bytes(GOOD)
    read = source_chunks(path.as_uri())
    assert b"".join(read()) == GOOD and b"".join(read()) == GOOD  # afresh on every call
    s3.create_bucket(Bucket="inputs")
    s3.put_object(Bucket="inputs", Key="dir/in put.jsonl", Body=GOOD)
    read = source_chunks("s3://inputs/dir/in%20put.jsonl", client=s3)
    assert b"".join(read()) == GOOD
    kept = keep_input(read, S3Sink(BUCKET, client=s3), CAP)
    assert kept.rows == 5
    for bad in ("http://x/y", "file://host/abs", "file:relative", "s3://bucket", "s3:///key", ""):
        with pytest.raises(ValueError, match="invalid input URI"):
            source_chunks(bad)


def test_a_source_that_cannot_be_read_says_whether_to_try_again(tmp_path: Path, s3: Any) -> None:
    """Not there, not a file, refused: an InputError (reading again will not help); an S3
    fault: a transient SinkError (the retry pass tries again later)."""
    from botocore.stub import Stubber

    for uri in ((tmp_path / "absent.jsonl").as_uri(), tmp_path.as_uri()):
        with pytest.raises(InputError, match="cannot read"):
            check_input(source_chunks(uri)(), CAP)
    with pytest.raises(InputError, match=r"cannot read s3://results/absent\.jsonl: NoSuchKey"):
        check_input(source_chunks(f"s3://{BUCKET}/absent.jsonl", client=s3)(), CAP)
    with pytest.raises(InputError, match="NoSuchBucket"):
        check_input(source_chunks("s3://no-such-bucket/in.jsonl", client=s3)(), CAP)
    with Stubber(s3) as stub:
        stub.add_client_error("get_object", "SlowDown", http_status_code=503)
        with pytest.raises(SinkError) as fault:
            check_input(source_chunks(f"s3://{BUCKET}/in.jsonl", client=s3)(), CAP)
    assert fault.value.transient and "SlowDown" in str(fault.value)


def test_subset_gives_the_original_bytes_in_input_order() -> None:
    lines = [
        b'{"key":"b","request":{"t":"\\u00e9"}}',
        b'{ "request": {}, "key" : "a" }',
        b'{"key":"c","request":{}}',
    ]
    data = b"\r\n".join(lines) + b"\n"
    assert list(subset(chunked(data, 5)(), {"c", "b", "zz"}, CAP)) == [
        ("b", lines[0]),
        ("c", lines[2]),
    ]
    assert list(subset(iter([data]), set(), CAP)) == []


def test_keys_cover_counts_the_output_keys_the_input_lacks() -> None:
    output = b"".join(
        json.dumps({"key": k, "error": {"code": 503}}).encode() + b"\n"
        for k in ("k0", "k4", "k9", "k9", "zz")
    )
    assert keys_cover(chunked(GOOD)(), chunked(output)(), CAP) == 2
    assert keys_cover(chunked(GOOD), chunked(output), CAP) == 2  # callables too
    assert keys_cover(chunked(GOOD), iter([b""]), CAP) == 0
