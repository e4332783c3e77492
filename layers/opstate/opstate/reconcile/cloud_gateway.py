"""The Google Cloud gateway (``CloudGateway``) on google-genai's enterprise (Vertex AI) mode.

- One ``genai.Client(vertexai=True, project=P, location=L, credentials=...)`` per scope, made
  on first use: the SDK turns a job's full name into ``batchPredictionJobs/{id}`` under its
  client's own project and location, so the client must be the job's. ``GOOGLE_VERTEX_BASE_URL``
  (read by the SDK) points every client at another server (the tests' fake).
- ``fetch`` by kind: ``batches.get(name=...)`` for ``.../batchPredictionJobs/N``;
  ``operations.get(GenerateVideosOperation(name=...))`` (``{model}:fetchPredictOperation``) for
  ``.../publishers/google/models/M/operations/ID``.
- ``batch_pages(scope, n)``: ``batches.list(config={"page_size": n})`` in that scope.
- Credentials (``cloud_credentials``) are loaded and refreshed here, under one lock, before any
  request: a missing, malformed, policy-refused or Google-refused credential is an
  ``AuthError`` (kept for the gateway's life, so the run asks once), a token endpoint that could
  not be reached is a transient ``GatewayError``. A 401 from the API is an ``AuthError`` too.
  Their messages name the exception and at most an OAuth error code, never a response body
  (``auth_error_reason``).

Owns no state beyond the clients and the credentials; imports google-genai and google-auth
inside functions only.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from opstate.config import Settings
from opstate.domain.events import EventError, from_batch_job, from_operation
from opstate.domain.model import OpEvent, OpRecord
from opstate.domain.names import Kind, cloud_scope
from opstate.gemini.batches import batch_job_pages
from opstate.gemini.errors import classify
from opstate.reconcile.cloud_credentials import (
    CredentialsError,
    auth_error_reason,
    load_credentials,
    token_request,
)
from opstate.reconcile.gateway import AuthError, GatewayError, Listed, Scope

if TYPE_CHECKING:
    from google import genai

CredentialsLoader = Callable[[Settings], Any]


def make_cloud_client(settings: Settings, scope: Scope, credentials: Any) -> genai.Client:
    """A google-genai client in enterprise mode for one scope (no SDK retries: the run paces)."""
    from google import genai
    from google.genai import types

    project, location = scope
    options = types.HttpOptions(
        timeout=max(1, int(settings.reconcile_http_timeout_s * 1000)),
        retry_options=types.HttpRetryOptions(attempts=1),
    )
    return genai.Client(
        vertexai=True,
        project=project,
        location=location,
        credentials=credentials,
        http_options=options,
    )


class GoogleCloudGateway:
    """``CloudGateway`` over google-genai (see the module docstring)."""

    def __init__(self, settings: Settings, *, load: CredentialsLoader = load_credentials) -> None:
        self.settings = settings
        self._load = load
        self._lock = threading.Lock()
        self._credentials: Any = None
        self._refused: AuthError | None = None
        self._clients: dict[Scope, genai.Client] = {}

    @property
    def scopes(self) -> Sequence[Scope]:
        return self.settings.google_cloud_scopes

    # --- credentials and clients ----------------------------------------------------------

    def _fresh_credentials(self) -> Any:
        """Loaded, unexpired credentials, or ``AuthError`` / a transient ``GatewayError``."""
        from google.auth import exceptions

        with self._lock:
            if self._refused is not None:
                raise self._refused
            try:
                if self._credentials is None:
                    self._credentials = self._load(self.settings)
                if not self._credentials.valid:
                    self._credentials.refresh(token_request())
            except CredentialsError as exc:
                self._refused = AuthError(str(exc))
                raise self._refused from None
            except exceptions.TransportError as exc:
                raise GatewayError(
                    f"Google token endpoint unreachable: {type(exc).__name__}", transient=True
                ) from None
            except exceptions.GoogleAuthError as exc:
                if exc.retryable:
                    raise GatewayError(
                        f"Google token refresh failed (retryable): {auth_error_reason(exc)}",
                        transient=True,
                    ) from None
                self._refused = AuthError(
                    f"Google refused the credentials: {auth_error_reason(exc)}"
                )
                raise self._refused from None
            return self._credentials

    def _client(self, scope: Scope) -> genai.Client:
        credentials = self._fresh_credentials()
        with self._lock:
            client = self._clients.get(scope)
            if client is None:
                client = make_cloud_client(self.settings, scope, credentials)
                self._clients[scope] = client
            return client

    # --- the port ---------------------------------------------------------------------------

    def batch_pages(self, scope: Scope, page_size: int) -> Iterator[Sequence[Listed]]:
        return batch_job_pages(self._client(scope), page_size, _classify)

    def fetch(self, record: OpRecord) -> OpEvent:
        scope = cloud_scope(record.name)
        if scope is None or record.kind not in (Kind.BATCH, Kind.VIDEO):
            raise GatewayError(f"{record.name} is no Google Cloud resource this system polls")
        try:
            client = self._client(scope)
            if record.kind is Kind.BATCH:
                event = from_batch_job(client.batches.get(name=record.name))
            else:
                from google.genai import types

                operation = types.GenerateVideosOperation.model_validate({"name": record.name})
                event = from_operation(client.operations.get(operation))
        except EventError:
            raise
        except Exception as exc:
            raise _classify(exc) from exc
        if event.name != record.name:
            event = replace(event, name=record.name)
        return event

    def close(self) -> None:
        with self._lock:
            clients, self._clients = list(self._clients.values()), {}
        for client in clients:
            client.close()


def _classify(exc: BaseException) -> GatewayError:
    """``classify``, with a 401 (the token itself refused) as an ``AuthError``."""
    error = classify(exc)
    if error.status == 401 and not isinstance(error, AuthError):
        return AuthError(error.message, status=401)
    return error
