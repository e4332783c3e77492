"""What every verifier shares: the ``Verifier`` port, its errors and header lookup."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from opstate.store.port import RetryableError

INVALID_SIGNATURE = "invalid signature"


class SignatureError(Exception):
    """The request is not authentic. The message never says which check failed."""

    def __init__(self) -> None:
        super().__init__(INVALID_SIGNATURE)


class SecretsUnavailableError(RetryableError):
    """The secrets or keys needed to verify could not be read: answer "retry later"."""


class InvalidSecretError(ValueError):
    """A webhook secret handed to a verifier is not a key (``whsec_`` + base64, >= 24 bytes)."""


class Verifier(Protocol):
    def verify(self, raw_body: bytes, headers: Mapping[str, str]) -> None:
        """Return if the request is authentic, else raise ``SignatureError``
        (or ``SecretsUnavailableError`` when the secrets cannot be read)."""
        ...


def lower_headers(headers: Mapping[str, str]) -> dict[str, str]:
    """``headers`` with lower-case names; values that are not text are left out."""
    return {str(k).lower(): v for k, v in headers.items() if isinstance(v, str)}
