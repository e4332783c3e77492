"""The quarantine keeps the exact signed bytes, on every implementation, and gives them back."""

from __future__ import annotations

import io
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest

from opstate.domain.times import parse_time
from opstate.observability import SERVICE, logger
from opstate.quarantine import (
    Delivery,
    Kept,
    LogQuarantine,
    Quarantine,
    QuarantineUnavailableError,
    SQLiteQuarantine,
    SqsQuarantine,
    quarantine_from_settings,
)
from tests.support.stores import QUARANTINE_KINDS, quarantine_for

NOW_NS = parse_time("2026-05-10T10:00:00.123456789Z")
BODIES = [b"{", b"\xff\xfe not utf-8", b'{"type":"video.generated","data":{"id":"a b"}}', b""]


@pytest.fixture(params=QUARANTINE_KINDS)
def quarantine(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Quarantine]:
    with quarantine_for(request.param, tmp_path) as made:
        yield made


def delivery(body: bytes, i: int = 0) -> Delivery:
    return Delivery.new(
        body, webhook_id=f"msg_{i}", reason="malformed-json", message="m", received_ns=NOW_NS + i
    )


def test_deliveries_come_back_byte_for_byte_and_go_once_removed(quarantine: Quarantine) -> None:
    sent = [delivery(body, i) for i, body in enumerate(BODIES)]
    for d in sent:
        quarantine.put(d)
    kept = quarantine.take(limit=10)
    assert sorted((k.delivery for k in kept), key=lambda d: d.received_ns) == sent
    for k in kept:
        quarantine.remove(k)
    assert quarantine.take(limit=10) == []


def test_the_message_format_is_versioned_json() -> None:
    d = delivery(b"\x00\xff{")
    assert Delivery.from_json(d.to_json()) == d
    assert '"receivedAt":"2026-05-10T10:00:00.123456789Z"' in d.to_json()
    for bad in (
        "{}",
        '{"v": 2, "id": "x", "body": ""}',
        '{"v": 1, "id": "x", "body": "!"}',
        "[",
        "3",
    ):
        with pytest.raises(ValueError):
            Delivery.from_json(bad)


def test_a_failed_send_is_retryable(tmp_path: Path) -> None:
    class Broken:
        def send_message(self, **_: Any) -> None:
            from botocore.exceptions import EndpointConnectionError

            raise EndpointConnectionError(endpoint_url="https://sqs.invalid")

    with pytest.raises(QuarantineUnavailableError):
        SqsQuarantine("https://sqs.invalid/q", client=Broken()).put(delivery(b"{"))
    directory = tmp_path / "not-a-file.db"
    directory.mkdir()
    with pytest.raises(QuarantineUnavailableError):
        SQLiteQuarantine(directory)


def test_the_sqs_client_is_built_on_first_use_not_at_init(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The webhook builds its quarantine at init; the SQS client (SQS's service model) waits
    for the first delivery that needs it, so cold starts that quarantine nothing skip it."""
    from moto import mock_aws

    built: list[str] = []
    real_client = boto3.client

    def recording_client(service: str, *args: Any, **kwargs: Any) -> Any:
        built.append(service)
        return real_client(service, *args, **kwargs)

    with mock_aws():
        url = real_client("sqs", region_name="us-east-1").create_queue(QueueName="q")["QueueUrl"]
        monkeypatch.setattr(boto3, "client", recording_client)
        monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
        kept_in = quarantine_from_settings(url)
        assert built == []
        kept_in.put(delivery(b"{"))
        kept_in.put(delivery(b"[", 1))
        assert built == ["sqs"]
        assert [k.delivery.body for k in kept_in.take(limit=10)] == [b"{", b"["]


def test_an_sqs_client_that_cannot_be_built_is_retryable(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    for name in ("AWS_DEFAULT_REGION", "AWS_REGION"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-config"))
    kept_in = quarantine_from_settings("https://sqs.invalid/q")  # no region: no client yet
    with pytest.raises(QuarantineUnavailableError):
        kept_in.put(delivery(b"{"))


def test_without_a_queue_the_delivery_is_logged_whole() -> None:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logger.registered_formatter)
    std = logging.getLogger(SERVICE)
    std.addHandler(handler)
    try:
        q = quarantine_from_settings(None)
        assert isinstance(q, LogQuarantine)
        q.put(delivery(b"{ kept in the log"))
    finally:
        std.removeHandler(handler)
    out = stream.getvalue()
    assert "webhook quarantined to the log" in out and "eyBrZXB0IGluIHRoZSBsb2c=" in out
    assert q.take() == [] and q.remove(Kept(delivery(b""), "x")) is None
