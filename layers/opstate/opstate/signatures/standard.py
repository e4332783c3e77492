"""Standard Webhooks: HMAC-SHA256 signatures by any of several secrets (static or read through
a provider such as Secrets Manager); see the package docstring for the rules."""

from __future__ import annotations

import base64
import binascii
import hmac
import re
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import UTC, datetime

from standardwebhooks.webhooks import Webhook

from opstate.config import DEFAULT_WEBHOOK_TOLERANCE_S
from opstate.signatures.common import (
    InvalidSecretError,
    SecretsUnavailableError,
    SignatureError,
    lower_headers,
)
from opstate.webhook_secrets import KEY_RULE, ParsedSecrets, parse_stored, secret_key

HEADER_ID = "webhook-id"
HEADER_TIMESTAMP = "webhook-timestamp"
HEADER_SIGNATURE = "webhook-signature"

# Bounds on what an unauthenticated sender can make us process.
MAX_ID_LENGTH = 256
MAX_SIGNATURE_HEADER_LENGTH = 4096
MAX_SIGNATURE_ENTRIES = 16
_TIMESTAMP = re.compile(r"[0-9]{1,12}", re.ASCII)


def _webhook(secret: str) -> Webhook:
    """A ``standardwebhooks.Webhook`` for one key (``opstate.webhook_secrets``' rule)."""
    key = secret_key(secret.strip())
    if key is None:
        raise InvalidSecretError(f"a webhook secret must be {KEY_RULE}")
    return Webhook(key)


def log_ignored_entries(parsed: ParsedSecrets, where: str) -> None:
    """One warning per stored entry that is not a key: its position, never its value."""
    if not parsed.ignored:
        return
    from opstate.observability import logger

    for position in parsed.ignored:
        logger.warning(
            "webhook secret entry ignored",
            extra={"secret_source": where, "position": position, "rule": KEY_RULE},
        )


def _candidate_signatures(header: str) -> list[bytes]:
    """The decoded ``v1`` entries of a ``webhook-signature`` header; other entries are ignored."""
    found: list[bytes] = []
    for entry in header.split()[:MAX_SIGNATURE_ENTRIES]:
        version, sep, value = entry.partition(",")
        if version != "v1" or not sep or not value:
            continue
        try:
            found.append(base64.b64decode(value, validate=True))
        except (binascii.Error, ValueError):
            continue
    return found


class StaticSecretsVerifier:
    """Standard Webhooks verification against a fixed set of secrets (any may match).

    ``clock_s`` returns the current Unix time in seconds; tests pass a frozen clock to verify
    the fixed sample events. ``tolerance_s`` bounds ``|now - webhook-timestamp|`` (None: no
    bound, for ``opstate replay``: a quarantined delivery is late by design). Every secret
    must be a key (``InvalidSecretError`` otherwise); with none, ``verify`` raises
    ``SecretsUnavailableError`` (503: nothing can be verified, nothing is accepted).
    """

    def __init__(
        self,
        secrets: Iterable[str],
        tolerance_s: int | None = DEFAULT_WEBHOOK_TOLERANCE_S,
        *,
        clock_s: Callable[[], float] = time.time,
    ) -> None:
        self._webhooks = tuple(_webhook(s) for s in secrets)
        self._tolerance_s = tolerance_s
        self._clock_s = clock_s

    @property
    def secret_count(self) -> int:
        return len(self._webhooks)

    def verify(self, raw_body: bytes, headers: Mapping[str, str]) -> None:
        lowered = lower_headers(headers)
        if not self._webhooks:
            raise SecretsUnavailableError("no usable webhook secret is configured")
        msg_id, sent_at, candidates = self._signed_headers(lowered)
        try:
            text = raw_body.decode("utf-8")
        except UnicodeDecodeError:
            raise SignatureError() from None
        if not self._matches(msg_id, sent_at, text, candidates):
            raise SignatureError()

    def _signed_headers(self, lowered: Mapping[str, str]) -> tuple[str, int, list[bytes]]:
        """(id, timestamp, decoded ``v1`` signatures) of a request whose headers are well
        formed and whose timestamp is within the tolerance; else ``SignatureError``."""
        msg_id = lowered.get(HEADER_ID, "")
        timestamp = lowered.get(HEADER_TIMESTAMP, "").strip()
        signature = lowered.get(HEADER_SIGNATURE, "")
        if not msg_id or len(msg_id) > MAX_ID_LENGTH or not signature:
            raise SignatureError()
        if len(signature) > MAX_SIGNATURE_HEADER_LENGTH:
            raise SignatureError()
        if _TIMESTAMP.fullmatch(timestamp) is None:
            raise SignatureError()
        sent_at = int(timestamp)
        if self._tolerance_s is not None and abs(self._clock_s() - sent_at) > self._tolerance_s:
            raise SignatureError()
        candidates = _candidate_signatures(signature)
        if not candidates:
            raise SignatureError()
        return msg_id, sent_at, candidates

    def _matches(self, msg_id: str, sent_at: int, text: str, candidates: list[bytes]) -> bool:
        """Whether any candidate is the signature of any secret."""
        when = datetime.fromtimestamp(sent_at, tz=UTC)
        matched = False
        for webhook in self._webhooks:
            expected = base64.b64decode(webhook.sign(msg_id, when, text).partition(",")[2])
            for candidate in candidates:
                # No early exit: every comparison runs, in constant time.
                matched |= hmac.compare_digest(expected, candidate)
        return matched


class SecretsProviderVerifier:
    """Standard Webhooks verification with secrets read from a provider on every request.

    The provider returns the stored value as it is (text, bytes or a list of entries) and
    caches it (Powertools Parameters ``max_age``, or a file's mtime): the value is parsed, its
    ignored entries logged and the HMAC keys rebuilt only when it changes.
    """

    def __init__(
        self,
        provider: Callable[[], str | bytes | Sequence[object]],
        tolerance_s: int | None = DEFAULT_WEBHOOK_TOLERANCE_S,
        *,
        clock_s: Callable[[], float] = time.time,
        where: str = "webhook secret",
    ) -> None:
        self._provider = provider
        self._tolerance_s = tolerance_s
        self._clock_s = clock_s
        self._where = where
        self._lock = threading.Lock()
        self._raw: object = None
        self._verifier = StaticSecretsVerifier((), tolerance_s, clock_s=clock_s)

    def _current(self) -> StaticSecretsVerifier:
        raw = self._provider()
        if not isinstance(raw, str | bytes):
            raw = tuple(raw)
        with self._lock:
            if raw != self._raw:
                parsed = parse_stored(raw)
                log_ignored_entries(parsed, self._where)
                self._verifier = StaticSecretsVerifier(
                    parsed.keys, self._tolerance_s, clock_s=self._clock_s
                )
                self._raw = raw
            return self._verifier

    def verify(self, raw_body: bytes, headers: Mapping[str, str]) -> None:
        self._current().verify(raw_body, headers)


def secrets_manager_provider(secret_id: str, max_age_s: int) -> Callable[[], str | bytes]:
    """A provider of the raw value of ``secret_id`` through Powertools Parameters (cached
    ``max_age_s``)."""

    def provide() -> str | bytes:
        from aws_lambda_powertools.utilities.parameters import get_secret
        from aws_lambda_powertools.utilities.parameters.exceptions import GetParameterError

        try:
            value = get_secret(secret_id, max_age=max_age_s)
        except GetParameterError as exc:
            raise SecretsUnavailableError(f"could not read the webhook secret: {exc}") from None
        if not isinstance(value, str | bytes):
            raise SecretsUnavailableError("the webhook secret value is not text")
        return value

    return provide
