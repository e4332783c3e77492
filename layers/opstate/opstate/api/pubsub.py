"""``POST /google-cloud/pubsub``: a Google Cloud Pub/Sub push delivery (Veo progress).

The same steps and rules as the Gemini webhook (``WebhookReceiver``): the size limit, then the
OIDC token Pub/Sub puts in ``Authorization`` (the dynamic-webhook JWT rules: RS256 by a key of
Google's JWKS, issuer ``https://accounts.google.com``, the configured audience, a bounded
lifetime, the pinned service-account email, verified), then the JSON envelope and its
``message.data`` (``events.from_pubsub``), then ingest. An unsigned or badly signed push is
refused (401); a signed one that cannot be read is quarantined and answered 200 (Pub/Sub
would otherwise redeliver it until the subscription's retention ends); a dependency fault is
503 (Pub/Sub retries). With no Pub/Sub configuration every push is refused.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from opstate.api.errors import ApiError, json_response, unavailable
from opstate.api.request import clip, parse_json, raw_body, request_headers
from opstate.api.router import Response
from opstate.api.webhook import WebhookReceiver
from opstate.domain.events import InvalidEventError, UnsupportedEventError, from_pubsub
from opstate.domain.views import decision_to_json
from opstate.observability import logger, record_signature_rejected, record_unsupported
from opstate.signatures import SignatureError
from opstate.store.port import RetryableError


class NotConfigured:
    """The verifier of an unconfigured Pub/Sub route: every push is refused."""

    def verify(self, raw_body: bytes, headers: Mapping[str, str]) -> None:
        logger.warning(
            "Pub/Sub push refused: OPSTATE_PUBSUB_AUDIENCE and OPSTATE_PUBSUB_EMAIL are not set"
        )
        raise SignatureError()


def _message_id(body: object) -> str | None:
    message = body.get("message") if isinstance(body, Mapping) else None
    value = message.get("messageId") if isinstance(message, Mapping) else None
    return clip(value) if isinstance(value, str) else None


# A push's proof is Google's OIDC token, a bearer credential: it is not kept with the delivery,
# so `opstate replay --quarantine` reports a kept push as unverified (it stays listed; replay it
# by hand with `opstate replay FILE` once read). docs/google-cloud.md says so.
_NO_PROOF: Mapping[str, str] = {}


class PubSubReceiver(WebhookReceiver):
    """Answers Pub/Sub push deliveries (see the module docstring)."""

    __slots__ = ()

    def receive(self, event: Mapping[str, Any]) -> tuple[Response, str]:
        raw = raw_body(event, self.max_bytes)
        try:
            self.verifier.verify(raw, request_headers(event))
        except SignatureError:
            record_signature_rejected(webhook_id=None)
            raise ApiError(401, "invalid-signature", "invalid signature") from None
        except RetryableError as exc:
            raise unavailable(exc, webhook_id=None) from None
        try:
            body = parse_json(raw)
        except ApiError as exc:
            return self.keep(raw, exc.code, exc.message, None, None, _NO_PROOF), "quarantined"
        message_id = _message_id(body)
        try:
            op_event = from_pubsub(body)
        except InvalidEventError as exc:
            return self.keep(raw, exc.code, exc.message, None, message_id, _NO_PROOF), "quarantined"
        except UnsupportedEventError as exc:  # pragma: no cover - from_operation has none
            record_unsupported(exc.reason, exc.message, source="pubsub", webhook_id=message_id)
            return json_response(200, {"applied": False, "reason": exc.reason}), "dropped"
        decision = self.ingest(op_event, webhook_id=message_id)
        outcome = "applied" if decision.applied else "dropped"
        return json_response(200, decision_to_json(decision)), outcome
