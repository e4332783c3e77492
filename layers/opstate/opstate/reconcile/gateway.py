"""The gateway ports: the three things a reconcile run asks Gemini (``Gateway``) and the two it
asks Google Cloud (``CloudGateway``).

The run depends on these ports only; ``opstate.reconcile.genai_gateway`` and
``opstate.reconcile.cloud_gateway`` implement them with google-genai, tests in memory. Answers
are already normalised ``OpEvent``s; failures are ``GatewayError``s carrying what the run needs
to decide (status, transient, ``Retry-After``): ``opstate.gemini``'s, as ``Listed`` is (both
re-exported here for the run and its tests).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Protocol

from opstate.domain.model import OpEvent, OpRecord
from opstate.gemini.batches import Listed
from opstate.gemini.errors import GatewayError


class AuthError(GatewayError):
    """The backend's credentials could not be loaded or were refused: no request to it can
    succeed until they are fixed, so the run stops asking it (one error, one metric)."""


@dataclass(frozen=True, slots=True)
class WebhookInfo:
    """One webhook of the project as Gemini lists it (``state`` None: not reported)."""

    id: str | None
    name: str | None
    state: str | None


class Gateway(Protocol):
    """What the reconciler needs from Gemini."""

    def webhooks(self) -> Sequence[WebhookInfo]:
        """Every webhook of the project (bounded number of pages). Raises ``GatewayError``."""
        ...

    def batch_pages(self, page_size: int) -> Iterator[Sequence[Listed]]:
        """Pages of batch jobs, newest first as the API lists them; the next page is fetched
        only when asked for. Raises ``GatewayError``."""
        ...

    def fetch(self, record: OpRecord) -> OpEvent:
        """The current state of ``record``'s operation as an event named ``record.name``.

        Raises ``GatewayError`` (404 included) or an ``EventError`` for an answer the
        normalisers refuse (``UnsupportedEventError`` for an unknown state).
        """
        ...


# A Google Cloud scope: (project, location).
Scope = tuple[str, str]


class CloudGateway(Protocol):
    """What the reconciler needs from Google Cloud (Vertex AI batch prediction jobs and Veo)."""

    @property
    def scopes(self) -> Sequence[Scope]:
        """The scopes discovery lists, in order (``OPSTATE_GOOGLE_CLOUD_SCOPES``)."""
        ...

    def batch_pages(self, scope: Scope, page_size: int) -> Iterator[Sequence[Listed]]:
        """Pages of the scope's batch prediction jobs, as the API lists them; the next page is
        fetched only when asked for. Raises ``GatewayError`` (``AuthError`` included)."""
        ...

    def fetch(self, record: OpRecord) -> OpEvent:
        """As ``Gateway.fetch``, for a ``projects/...`` record; ``AuthError`` when the
        credentials are missing or refused."""
        ...


__all__ = [
    "AuthError",
    "CloudGateway",
    "Gateway",
    "GatewayError",
    "Listed",
    "Scope",
    "WebhookInfo",
]
