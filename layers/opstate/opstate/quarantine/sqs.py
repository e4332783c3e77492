"""``SqsQuarantine``: an SQS queue (production; ``OPSTATE_QUARANTINE_QUEUE_URL``). Its resource
policy lets only the webhook function send; its own limits bound it, and an alarm fires on
every delivery kept. boto3 is imported on first use, not here.
"""

from __future__ import annotations

import threading
from typing import Any

from opstate.quarantine.port import Delivery, Kept, QuarantineUnavailableError

# How long a delivery a replay walked past stays hidden in SQS (the local marks need no wait).
SKIP_VISIBILITY_S = 15 * 60


class SqsQuarantine:
    """An SQS queue. ``take`` receives with a visibility timeout: a delivery not removed
    (its replay failed) comes back after it; ``skip`` hides it for ``SKIP_VISIBILITY_S``.

    Without ``client``, the SQS client is built on first use, not here: the webhook builds its
    quarantine at init, and most cold starts never quarantine anything, so building the client
    (loading SQS's service model) there would only lengthen every cold start (docs/deploy.md,
    "Import only what the first request needs")."""

    def __init__(
        self, queue_url: str, *, client: Any = None, visibility_timeout_s: int = 60
    ) -> None:
        self.queue_url = queue_url
        self.visibility_timeout_s = visibility_timeout_s
        self._client: Any = client
        self._client_lock = threading.Lock()

    @property
    def client(self) -> Any:
        """The SQS client (built on first use when none was given)."""
        with self._client_lock:
            if self._client is None:
                import boto3
                from botocore.config import Config

                self._client = boto3.client(
                    "sqs",
                    config=Config(
                        retries={"mode": "standard", "total_max_attempts": 3},
                        connect_timeout=2,
                        read_timeout=5,
                    ),
                )
            return self._client

    def put(self, delivery: Delivery) -> str:
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            self.client.send_message(QueueUrl=self.queue_url, MessageBody=delivery.to_json())
        except (BotoCoreError, ClientError) as exc:
            raise QuarantineUnavailableError(f"SQS SendMessage failed: {exc}") from exc
        return delivery.id

    def _receive(self, limit: int, visibility_s: int) -> list[Kept]:
        out: list[Kept] = []
        seen: set[str] = set()
        while len(out) < limit:
            answer = self.client.receive_message(
                QueueUrl=self.queue_url,
                MaxNumberOfMessages=min(10, limit - len(out)),
                VisibilityTimeout=visibility_s,
                WaitTimeSeconds=0,
            )
            messages = [m for m in answer.get("Messages") or [] if m.get("MessageId") not in seen]
            if not messages:
                break  # empty, or only messages this call already took (visibility ran out)
            for message in messages:
                seen.add(str(message.get("MessageId")))
                try:
                    delivery = Delivery.from_json(message["Body"])
                except ValueError:
                    continue  # not ours: left in the queue for an operator
                out.append(Kept(delivery, message["ReceiptHandle"]))
        return out

    def take(self, limit: int = 10) -> list[Kept]:
        return self._receive(limit, self.visibility_timeout_s)

    def remove(self, kept: Kept) -> None:
        self.client.delete_message(QueueUrl=self.queue_url, ReceiptHandle=kept.handle)

    def skip(self, kept: Kept) -> None:
        self.client.change_message_visibility(
            QueueUrl=self.queue_url, ReceiptHandle=kept.handle, VisibilityTimeout=SKIP_VISIBILITY_S
        )

    def entries(self, limit: int = 1000) -> list[Delivery]:
        """What the queue shows now (visibility 0: nothing is hidden from a replay)."""
        return sorted(
            (k.delivery for k in self._receive(limit, 0)), key=lambda d: (d.received_ns, d.id)
        )
