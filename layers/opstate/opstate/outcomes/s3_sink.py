"""The S3 sink (``s3://BUCKET/PREFIX``): bounded memory, as few PUT-class requests as an
object allows (S3 bills each one; issue 48).

Bytes are buffered up to ``part_size`` (8 MiB by default; S3's minimum is 5 MiB), so memory is
bounded by the part size whatever the object's size. How an object is written:

- **whole in one part** (the buffer never filled): ``commit`` writes it with one ``PutObject``
  onto its key, with its metadata ``opstate-name`` and ``sha256`` (``summary.json``, ledgers,
  markers, most inputs and outputs of a small batch): 1 request;
- **larger, its sha256 known before its bytes** (``open(..., sha256=...)``: what Gemini
  declared, a checked input's): a multipart upload onto the key itself, its metadata set when
  it is created, one ``UploadPart`` per part; ``commit`` refuses any other digest and completes
  it: parts + 2 requests;
- **larger, its sha256 known only at the end**: a multipart upload to a temporary key under
  ``PREFIX/.incoming/``, then one ``CopyObject`` onto its key with the metadata (boto3's
  managed multipart copy above ``COPY_ONE_REQUEST_MAX``, S3's one-request limit is 5 GB) and
  the temporary object deleted: parts + 3 requests.

Before issue 48 every object took the last way with a managed copy (multipart above 8 MiB): a
10 MB output 8 requests, a ``summary.json`` 4. An object appears under its key only whole: a
``PutObject`` and a ``CompleteMultipartUpload`` are atomic, and any failure before the commit
aborts the multipart upload (the template's lifecycle rule aborts forgotten uploads under
``results/`` and expires ``.incoming/``). The only module of the package importing boto3.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from botocore.exceptions import BotoCoreError, ClientError

from opstate.outcomes.sink import SinkError, StoredObject, check_digest

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client
    from mypy_boto3_s3.type_defs import CompletedPartTypeDef

DEFAULT_PART_SIZE = 8 * 1024 * 1024
MIN_PART_SIZE = 5 * 1024 * 1024
# Copied in one CopyObject up to this size (S3 allows 5 GB in one request; above about a GiB
# boto3's parallel multipart copy is the faster within a function's time).
COPY_ONE_REQUEST_MAX = 1024 * 1024 * 1024
NAME_KEY = "opstate-name"
SHA256_KEY = "sha256"
INCOMING = ".incoming"


def _fault(exc: Exception, what: str) -> SinkError:
    code = ""
    if isinstance(exc, ClientError):
        code = str(exc.response.get("Error", {}).get("Code") or "")
    transient = code not in ("AccessDenied", "NoSuchBucket", "InvalidBucketName")
    return SinkError(f"S3 {what} failed: {code or type(exc).__name__}: {exc}", transient=transient)


class _S3Writer:
    def __init__(self, sink: S3Sink, key: str, name: str, expected: str) -> None:
        self.sink = sink
        self.key = key
        self.name = name
        self.expected = expected
        self.final = sink.full_key(key)
        self.target = ""  # the key of the multipart upload, once begun
        self.upload_id = ""  # the multipart upload in progress
        self.temp_done = ""  # a completed temporary object not yet copied into place
        self.buffer = bytearray()
        self.parts: list[CompletedPartTypeDef] = []
        self.size = 0
        self.committed: StoredObject | None = None

    def _metadata(self, sha256: str) -> dict[str, str]:
        return {NAME_KEY: self.name, SHA256_KEY: sha256} if sha256 else {NAME_KEY: self.name}

    def write(self, data: bytes) -> int:
        self.buffer += data
        self.size += len(data)
        while len(self.buffer) >= self.sink.part_size:
            part = bytes(self.buffer[: self.sink.part_size])
            del self.buffer[: self.sink.part_size]
            self._send(part)
        return len(data)

    def _begin(self) -> None:
        """The multipart upload: onto the key when its sha256 is known, else a temporary key."""
        sink = self.sink
        temp = "" if self.expected else sink.full_key(f"{INCOMING}/{uuid.uuid4().hex}")
        target = temp or self.final
        try:
            upload = sink.client.create_multipart_upload(
                Bucket=sink.bucket,
                Key=target,
                Metadata=self._metadata(self.expected),
                ContentType=sink.content_type(self.final),
            )
        except (ClientError, BotoCoreError) as exc:
            raise _fault(exc, "CreateMultipartUpload") from exc
        self.target, self.upload_id = target, upload["UploadId"]

    def _send(self, part: bytes) -> None:
        if not self.upload_id:
            self._begin()
        number = len(self.parts) + 1
        try:
            answer = self.sink.client.upload_part(
                Bucket=self.sink.bucket,
                Key=self.target,
                UploadId=self.upload_id,
                PartNumber=number,
                Body=part,
            )
        except (ClientError, BotoCoreError) as exc:
            raise _fault(exc, "UploadPart") from exc
        self.parts.append({"PartNumber": number, "ETag": answer["ETag"]})

    def commit(self, sha256: str) -> StoredObject:
        check_digest(self.expected, sha256, self.key)
        client, bucket = self.sink.client, self.sink.bucket
        try:
            if not self.upload_id:  # whole in the buffer: one PutObject onto the key
                client.put_object(
                    Bucket=bucket,
                    Key=self.final,
                    Body=bytes(self.buffer),
                    Metadata=self._metadata(sha256),
                    ContentType=self.sink.content_type(self.final),
                )
            else:
                if self.buffer:
                    self._send(bytes(self.buffer))
                self.buffer.clear()
                client.complete_multipart_upload(
                    Bucket=bucket,
                    Key=self.target,
                    UploadId=self.upload_id,
                    MultipartUpload={"Parts": self.parts},
                )
                self.upload_id = ""
                if self.target != self.final:
                    self.temp_done = self.target
                    self._place(sha256)
                    client.delete_object(Bucket=bucket, Key=self.temp_done)
                    self.temp_done = ""
        except (ClientError, BotoCoreError) as exc:
            raise _fault(exc, "commit") from exc
        self.committed = StoredObject(self.sink.location(self.key), self.size, sha256)
        return self.committed

    def _place(self, sha256: str) -> None:
        """Copy the completed temporary object onto the key, with its metadata."""
        client, bucket = self.sink.client, self.sink.bucket
        content_type = self.sink.content_type(self.final)
        if self.size <= COPY_ONE_REQUEST_MAX:
            client.copy_object(
                Bucket=bucket,
                Key=self.final,
                CopySource={"Bucket": bucket, "Key": self.temp_done},
                Metadata=self._metadata(sha256),
                MetadataDirective="REPLACE",
                ContentType=content_type,
            )
            return
        client.copy(
            {"Bucket": bucket, "Key": self.temp_done},
            bucket,
            self.final,
            ExtraArgs={
                "Metadata": self._metadata(sha256),
                "MetadataDirective": "REPLACE",
                "ContentType": content_type,
            },
        )


class S3Sink:
    """The ``Sink`` on an S3 bucket and prefix (see the module docstring)."""

    def __init__(
        self,
        bucket: str,
        prefix: str = "",
        *,
        client: S3Client | None = None,
        part_size: int | None = None,
    ) -> None:
        if not bucket:
            raise ValueError("an S3 bucket name is required")
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self.part_size = max(MIN_PART_SIZE, part_size or DEFAULT_PART_SIZE)
        self.client: S3Client = client if client is not None else _make_client()
        self.url = f"s3://{bucket}/{self.prefix}" if self.prefix else f"s3://{bucket}"

    def full_key(self, key: str) -> str:
        key = key.strip("/")
        return f"{self.prefix}/{key}" if self.prefix else key

    def location(self, key: str) -> str:
        return f"s3://{self.bucket}/{self.full_key(key)}"

    @staticmethod
    def content_type(key: str) -> str:
        if key.endswith(".json"):
            return "application/json"
        if key.endswith(".jsonl"):
            return "application/jsonl"
        if key.endswith(".mp4"):
            return "video/mp4"
        return "application/octet-stream"

    @contextmanager
    def open(self, key: str, *, name: str, sha256: str = "") -> Iterator[_S3Writer]:
        writer = _S3Writer(self, key, name, sha256)
        try:
            yield writer
        finally:
            if writer.committed is None:
                self._abandon(writer)

    def _abandon(self, writer: _S3Writer) -> None:
        try:
            if writer.upload_id:
                self.client.abort_multipart_upload(
                    Bucket=self.bucket, Key=writer.target, UploadId=writer.upload_id
                )
            elif writer.temp_done:
                self.client.delete_object(Bucket=self.bucket, Key=writer.temp_done)
        except (ClientError, BotoCoreError):  # the lifecycle rule cleans up what is left
            pass

    def head(self, key: str) -> StoredObject | None:
        try:
            answer = self.client.head_object(Bucket=self.bucket, Key=self.full_key(key))
        except ClientError as exc:
            status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            if status == 404 or exc.response.get("Error", {}).get("Code") in ("404", "NoSuchKey"):
                return None
            raise _fault(exc, "HeadObject") from exc
        except BotoCoreError as exc:
            raise _fault(exc, "HeadObject") from exc
        metadata = answer.get("Metadata") or {}
        return StoredObject(
            self.location(key), int(answer.get("ContentLength", 0)), metadata.get(SHA256_KEY, "")
        )

    def read(self, key: str, limit: int) -> bytes | None:
        try:
            answer = self.client.get_object(Bucket=self.bucket, Key=self.full_key(key))
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") in ("NoSuchKey", "404"):
                return None
            raise _fault(exc, "GetObject") from exc
        except BotoCoreError as exc:
            raise _fault(exc, "GetObject") from exc
        body = answer["Body"]
        try:
            return bytes(body.read(limit))
        finally:
            body.close()

    def resolve(self, location: str) -> str:
        """The key under the prefix of ``location`` (``s3://BUCKET/PREFIX/KEY``): a key with
        an empty, ``.`` or ``..`` segment is refused, as are other buckets and prefixes."""
        bucket = f"s3://{self.bucket}/"
        full = location[len(bucket) :] if location.startswith(bucket) else ""
        inside = f"{self.prefix}/" if self.prefix else ""
        key = full[len(inside) :] if full.startswith(inside) else ""
        if not key or any(part in ("", ".", "..") for part in key.split("/")):
            raise SinkError(f"{location} is outside {self.url}", transient=False)
        return key

    def chunks(self, location: str) -> Iterator[bytes]:
        key = self.full_key(self.resolve(location))
        try:
            answer = self.client.get_object(Bucket=self.bucket, Key=key)
            yield from answer["Body"].iter_chunks(1024 * 1024)
        except (ClientError, BotoCoreError) as exc:
            raise _fault(exc, "GetObject") from exc


def _make_client() -> S3Client:
    import boto3
    from botocore.config import Config

    config = Config(retries={"max_attempts": 5, "mode": "standard"}, connect_timeout=5)
    return boto3.session.Session().client("s3", config=config)
