"""``POST /gemini/webhook``: size check, signature, JSON, ``from_webhook``, ingest; a signed
delivery that cannot be read is kept in the quarantine and answered 200.

The quarantine's code is imported by the first delivery kept, not at init (most cold starts
keep nothing): the receiver keeps through a ``Keeper``, e.g. ``QuarantineOnFirstUse``."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Protocol

from opstate.api.errors import ApiError, json_response, unavailable
from opstate.api.ingesting import Ingester
from opstate.api.lazy import OnFirstUse
from opstate.api.request import clip, parse_json, raw_body, request_headers
from opstate.api.router import Response
from opstate.config import DEFAULT_MAX_FUTURE_SKEW_S
from opstate.domain.events import (
    InvalidEventError,
    UnsupportedEventError,
    check_future_skew,
    from_webhook,
    webhook_kind_hint,
)
from opstate.domain.names import InvalidNameError, canonical_name
from opstate.domain.views import decision_to_json
from opstate.observability import (
    count,
    logger,
    record_signature_rejected,
    record_unsupported,
    record_webhook_outcome,
)
from opstate.signatures import (
    HEADER_ID,
    HEADER_SIGNATURE,
    HEADER_TIMESTAMP,
    MAX_ID_LENGTH,
    SignatureError,
    Verifier,
)
from opstate.store.port import RetryableError

if TYPE_CHECKING:
    from opstate.quarantine import Delivery


class Keeper(Protocol):
    """Where signed deliveries that cannot be read are kept (``opstate.quarantine``'s
    ``put``: the kept id; ``QuarantineFullError`` or another ``RetryableError`` when it
    cannot keep one)."""

    def put(self, delivery: Delivery) -> str: ...


class QuarantineOnFirstUse:
    """The quarantine ``build`` returns, built (its module imported) by the first ``put``."""

    __slots__ = ("_quarantine",)

    def __init__(self, build: Callable[[], Keeper]) -> None:
        self._quarantine = OnFirstUse(build)

    def put(self, delivery: Delivery) -> str:
        return self._quarantine.get().put(delivery)


class WebhookReceiver:
    """Answers webhook deliveries: verified with ``verifier``, bodies over ``max_bytes`` refused
    (413), unreadable signed deliveries kept in ``quarantine``."""

    __slots__ = ("clock_ns", "ingest", "max_bytes", "max_future_skew_s", "quarantine", "verifier")

    def __init__(
        self,
        *,
        verifier: Verifier,
        ingest: Ingester,
        quarantine: Keeper,
        max_bytes: int,
        clock_ns: Callable[[], int],
        max_future_skew_s: float = DEFAULT_MAX_FUTURE_SKEW_S,
    ) -> None:
        self.max_future_skew_s = max_future_skew_s
        self.verifier = verifier
        self.ingest = ingest
        self.quarantine = quarantine
        self.max_bytes = max_bytes
        self.clock_ns = clock_ns

    def answer(self, event: Mapping[str, Any]) -> Response:
        """The response to one webhook request, its ``WebhookDeliveries`` outcome counted."""
        try:
            response, outcome = self.receive(event)
        except ApiError as exc:
            record_webhook_outcome(error_outcome(exc.status))
            raise
        except Exception:
            record_webhook_outcome("error")
            raise
        record_webhook_outcome(outcome)
        return response

    def receive(self, event: Mapping[str, Any]) -> tuple[Response, str]:
        """The answer to one webhook request and its ``WebhookDeliveries`` outcome."""
        raw = raw_body(event, self.max_bytes)
        headers = request_headers(event)
        webhook_id = clip(headers.get("webhook-id"))
        try:
            self.verifier.verify(raw, headers)
        except SignatureError:
            record_signature_rejected(webhook_id=webhook_id)
            raise ApiError(401, "invalid-signature", "invalid signature") from None
        except RetryableError as exc:
            raise unavailable(exc, webhook_id=webhook_id) from None
        proof = proof_headers(self.verifier, headers)
        try:
            body = parse_json(raw)
        except ApiError as exc:
            return self.keep(raw, exc.code, exc.message, None, webhook_id, proof), "quarantined"
        try:
            # A time too far ahead of our clock would freeze the record: kept, not applied.
            op_event = check_future_skew(
                from_webhook(body), now_ns=self.clock_ns(), max_skew_s=self.max_future_skew_s
            )
        except InvalidEventError as exc:
            return self.keep(raw, exc.code, exc.message, body, webhook_id, proof), "quarantined"
        except UnsupportedEventError as exc:
            return _unsupported(exc, body, webhook_id), "dropped"
        decision = self.ingest(op_event, webhook_id=webhook_id)
        outcome = "applied" if decision.applied else "dropped"
        return json_response(200, decision_to_json(decision)), outcome

    def keep(
        self,
        raw: bytes,
        code: str,
        message: str,
        body: object,
        webhook_id: str | None,
        proof: Mapping[str, str],
    ) -> Response:
        """A signed delivery we cannot read: kept with the headers that proved it (``proof``,
        verified again on replay), answered 200 (never a 4xx: Gemini would retry it for a day,
        then disable the endpoint), counted; 503 if it cannot be kept (the quarantine is full
        or down: Gemini retries)."""
        from opstate.quarantine import Delivery, QuarantineFullError

        # Kept (and deduplicated) under the whole webhook-id the signature covered, not the
        # clipped one the logs carry: two long ids sharing a prefix are two deliveries.
        full_id = proof.get(HEADER_ID)
        delivery = Delivery.new(
            raw,
            webhook_id=full_id if full_id and len(full_id) <= MAX_ID_LENGTH else None,
            reason=code,
            message=message,
            received_ns=self.clock_ns(),
            proof=proof,
        )
        try:
            kept_id = self.quarantine.put(delivery)
        except QuarantineFullError as exc:
            count("QuarantineFull")
            logger.error("webhook not kept: the quarantine is full", extra={"detail": str(exc)})
            raise unavailable(exc, webhook_id=webhook_id) from None
        except RetryableError as exc:
            raise unavailable(exc, webhook_id=webhook_id) from None
        name = best_effort_name(body)
        logger.warning(
            "webhook quarantined",
            extra={
                "reason": "quarantined",
                "error": code,
                "detail": message[:300],
                "operation": name,
                "webhook_id": webhook_id,
                "quarantine_id": kept_id,
            },
        )
        count("WebhooksQuarantined")
        return json_response(
            200,
            {
                "applied": False,
                "reason": "quarantined",
                "name": name,
                "state": None,
                "version": 0,
                "error": code,
                "quarantineId": kept_id,
            },
        )


def proof_headers(verifier: Verifier, headers: Mapping[str, str]) -> dict[str, str]:
    """The headers that proved a delivery authentic, kept with it in the quarantine so a replay
    can verify it again: Standard Webhooks' three when it carried a signature (the JWT header,
    which may hold any bearer credential, is then not kept), else the JWT header of a dynamic
    webhook (and its ``webhook-id``), as ``signatures.WebhookVerifier`` chose."""
    names = {HEADER_ID, HEADER_TIMESTAMP, HEADER_SIGNATURE}
    header = getattr(getattr(verifier, "jwt", None), "header", None)
    if HEADER_SIGNATURE not in headers and isinstance(header, str):
        names = {HEADER_ID, header}
    return {name: headers[name] for name in names if name in headers}


def _unsupported(exc: UnsupportedEventError, body: object, webhook_id: str | None) -> Response:
    """A readable webhook of a type or state we deliberately ignore: logged, answered 200."""
    name = best_effort_name(body)
    event_type = body.get("type") if isinstance(body, Mapping) else None
    record_unsupported(
        exc.reason,
        exc.message,
        name=name,
        event_type=event_type if isinstance(event_type, str) else None,
        source="webhook",
        webhook_id=webhook_id,
    )
    return json_response(
        200,
        {"applied": False, "reason": exc.reason, "name": name, "state": None, "version": 0},
    )


def best_effort_name(body: object) -> str | None:
    """The canonical name an unsupported webhook refers to, if one can be read (logging)."""
    if not isinstance(body, Mapping):
        return None
    data = body.get("data")
    if not isinstance(data, Mapping):
        return None
    raw = data.get("id") or data.get("name")
    try:
        return canonical_name(raw, webhook_kind_hint(body.get("type")))
    except InvalidNameError:
        return None


def error_outcome(status: int) -> str:
    """The ``WebhookDeliveries`` outcome of a webhook answered with an error ``status``."""
    if status == 401:
        return "rejected"
    if status == 503:
        return "retry-later"
    return "invalid" if 400 <= status < 500 else "error"
