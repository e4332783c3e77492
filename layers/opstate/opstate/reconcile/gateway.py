"""The gateway ports: the three things a reconcile run asks Gemini (``Gateway``) and the two it
asks Google Cloud (``CloudGateway``).

The run depends on these ports only; ``opstate.reconcile.genai_gateway`` and
``opstate.reconcile.cloud_gateway`` implement them with google-genai, tests in memory. Answers
are already normalised ``OpEvent``s; failures are ``GatewayError``s carrying what the run needs
to decide (status, transient, ``Retry-After``).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Protocol

from opstate.domain.events import EventError
from opstate.domain.model import OpEvent, OpRecord


class GatewayError(Exception):
    """A request failed. ``status`` is the HTTP status (None: no answer, e.g. a timeout);
    ``transient``: the same request may succeed later; ``retry_after_s``: the server's
    ``Retry-After``, when it sent one; ``said``: what the server said, for a person to read
    (``sentence`` falls back to ``message``, the technical text that is logged)."""

    def __init__(
        self,
        message: str,
        *,
        status: int | None = None,
        transient: bool = False,
        retry_after_s: float | None = None,
        said: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.transient = transient
        self.retry_after_s = retry_after_s
        self.said = said

    @property
    def sentence(self) -> str:
        return self.said or self.message

    @property
    def not_found(self) -> bool:
        return self.status == 404


class AuthError(GatewayError):
    """The backend's credentials could not be loaded or were refused: no request to it can
    succeed until they are fixed, so the run stops asking it (one error, one metric)."""


@dataclass(frozen=True, slots=True)
class WebhookInfo:
    """One webhook of the project as Gemini lists it (``state`` None: not reported)."""

    id: str | None
    name: str | None
    state: str | None


# One listed batch job: its raw name and either its event or why it was refused.
Listed = tuple[str, OpEvent | EventError]


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
