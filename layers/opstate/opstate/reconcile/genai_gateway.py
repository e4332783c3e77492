"""The gateway port on google-genai: the only module that imports ``google.genai``.

It imports the SDK inside functions, so ``import opstate.reconcile`` stays cheap for the CLI.

- ``webhooks``: ``client.webhooks.list()``, at most ``MAX_WEBHOOK_PAGES`` pages.
- ``batch_pages``: the REST listing (``GET batches?pageSize=n&pageToken=t``), one page per
  step, each job read as ``fetch`` reads one (``rest_batch_event``), so a listed batch keeps its
  progress too.
- ``fetch`` by kind: a batch's REST resource (``GET batches/{id}`` through the client's own
  ``_api_client.request``, so ``metadata.batchStats`` is kept as the ``batch_stats`` detail:
  the SDK's ``BatchJob`` drops it, python-genai #1323); ``operations.get`` with a
  ``GenerateVideosOperation`` (Veo) or an ``ImportFileOperation`` (file-search imports and any
  other LRO: only name, done, error and response are read); ``interactions.get(<id>)``. The
  answer is normalised with the webhook path's normalisers and renamed to the record asked
  about.
- SDK exceptions become ``GatewayError`` (``classify``): the HTTP status, whether it is worth
  retrying later (408, 429, 5xx, timeouts, connection errors) and ``Retry-After`` (seconds or an
  HTTP date).
"""

from __future__ import annotations

import importlib
import json
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import replace
from email.utils import parsedate_to_datetime
from typing import TYPE_CHECKING, Any
from urllib.parse import urlencode

from opstate.config import ConfigError, Settings
from opstate.domain.events import EventError, from_batch_job, from_interaction, from_operation
from opstate.domain.model import OpEvent, OpRecord
from opstate.domain.names import Kind, api_name
from opstate.domain.views import PROGRESS_DETAIL
from opstate.reconcile.gateway import GatewayError, Listed, WebhookInfo

if TYPE_CHECKING:
    from google import genai

# Pages of webhooks read per call (50 per page by default: far more than any project has).
MAX_WEBHOOK_PAGES = 5
# HTTP statuses after which the same request may succeed later.
TRANSIENT_STATUSES = frozenset({408, 429, 500, 502, 503, 504})
# Keys tried, in order, when the Gemini API key secret holds a JSON object.
SECRET_JSON_KEYS = ("GEMINI_API_KEY", "api_key", "apiKey", "key")


def _transport_errors() -> tuple[type[BaseException], ...]:
    """Timeouts and connection failures of whichever httpx flavour the SDK runs on."""
    found: list[type[BaseException]] = []
    for module_name in ("httpx", "httpx2"):
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            continue
        cls = getattr(module, "TransportError", None)
        if isinstance(cls, type) and issubclass(cls, BaseException):
            found.append(cls)
    try:
        from google.genai._interactions import APIConnectionError

        found.append(APIConnectionError)
    except ImportError:  # pragma: no cover - older SDKs
        pass
    return tuple(found)


def retry_after_s(headers: Any, now_s: float | None = None) -> float | None:
    """``Retry-After`` of a response's headers in seconds (delta-seconds or an HTTP date)."""
    if headers is None:
        return None
    try:
        raw = headers.get("retry-after")
    except Exception:
        return None
    if not isinstance(raw, str) or not raw.strip():
        return None
    text = raw.strip()
    try:
        return max(0.0, float(text))
    except ValueError:
        pass
    try:
        when = parsedate_to_datetime(text)
    except (TypeError, ValueError):
        return None
    import time

    now = time.time() if now_s is None else now_s
    return max(0.0, when.timestamp() - now)


def _said(status: object, message: object) -> str | None:
    """``PERMISSION_DENIED: API key not valid``: what the server said, for the sentence."""
    return ": ".join(str(part) for part in (status, message) if part) or None


def batch_job_pages(
    client: Any, page_size: int, classify: Callable[[BaseException], GatewayError]
) -> Iterator[Sequence[Listed]]:
    """``client.batches.list`` page by page, each job as an event or the ``EventError`` that
    refused it; an SDK failure as ``classify`` says (Google Cloud's listing: the SDK keeps a
    Cloud job's ``completionStats``)."""
    try:
        pager = client.batches.list(config={"page_size": page_size})
    except Exception as exc:
        raise classify(exc) from exc
    while True:
        page: list[Listed] = []
        for job in pager.page:
            raw_name = str(getattr(job, "name", None))
            try:
                page.append((raw_name, from_batch_job(job)))
            except EventError as exc:
                page.append((raw_name, exc))
        yield page
        if not pager.config.get("page_token"):
            return
        try:
            pager.next_page()
        except Exception as exc:
            raise classify(exc) from exc


def classify(exc: BaseException) -> GatewayError:
    """An SDK exception as a ``GatewayError``."""
    message = f"{type(exc).__name__}: {exc}"[:300]
    if isinstance(exc, GatewayError):
        return exc
    if isinstance(exc, _transport_errors()):
        return GatewayError(message, status=None, transient=True)
    from google.genai import errors as genai_errors

    status: object
    headers: Any = None
    said: str | None = None
    if isinstance(exc, genai_errors.APIError):
        status = exc.code
        headers = getattr(exc.response, "headers", None)
        said = _said(exc.status, exc.message)
    else:
        status = getattr(exc, "status_code", None)
        headers = getattr(getattr(exc, "response", None), "headers", None)
        error = getattr(exc, "body", None)
        error = error.get("error") if isinstance(error, dict) else None
        if isinstance(error, dict):
            said = _said(error.get("status"), error.get("message"))
    if isinstance(status, int) and not isinstance(status, bool):
        return GatewayError(
            message,
            status=status,
            transient=status in TRANSIENT_STATUSES,
            retry_after_s=retry_after_s(headers) if status in TRANSIENT_STATUSES else None,
            said=said,
        )
    return GatewayError(message, status=None, transient=False)


class GenaiGateway:
    """``Gateway`` over a ``google.genai.Client`` (see the module docstring)."""

    def __init__(self, client: genai.Client) -> None:
        self.client = client
        self._lock = threading.Lock()
        self._interactions: Any = None

    def webhooks(self) -> Sequence[WebhookInfo]:
        found: list[WebhookInfo] = []
        try:
            page_token: str | None = None
            for _ in range(MAX_WEBHOOK_PAGES):
                listing = self.client.webhooks.list(page_token=page_token)
                for webhook in listing.webhooks or []:
                    state = webhook.state
                    found.append(
                        WebhookInfo(webhook.id, webhook.name, None if state is None else str(state))
                    )
                page_token = listing.next_page_token or None
                if not page_token:
                    break
        except Exception as exc:
            raise classify(exc) from exc
        return found

    def batch_pages(self, page_size: int) -> Iterator[Sequence[Listed]]:
        return rest_batch_pages(self.client, page_size)

    def fetch(self, record: OpRecord) -> OpEvent:
        try:
            event = self._fetch(record)
        except EventError:
            raise
        except Exception as exc:
            raise classify(exc) from exc
        if event.name != record.name:
            # We asked for this resource: whatever spelling came back, it is this record.
            event = replace(event, name=record.name)
        return event

    def _fetch(self, record: OpRecord) -> OpEvent:
        kind = record.kind
        if kind is Kind.BATCH:
            return self._batch(record.name)
        if kind is Kind.INTERACTION:
            interaction_id = record.name.split("/", 1)[1]
            with self._lock:  # a lazily built sub-client: build it once, not in N threads
                if self._interactions is None:
                    self._interactions = self.client.interactions
                interactions = self._interactions
            return from_interaction(interactions.get(interaction_id))
        from google.genai import types

        operation: types.GenerateVideosOperation | types.ImportFileOperation
        if kind is Kind.VIDEO:
            # The key has no model (models/-/operations/<id>): put it back to ask for it.
            full_name = api_name(record.name, record.details)
            operation = types.GenerateVideosOperation.model_validate({"name": full_name})
        else:
            operation = types.ImportFileOperation.model_validate({"name": record.name})
        return from_operation(self.client.operations.get(operation))

    def _batch(self, name: str) -> OpEvent:
        """A batch from its REST resource (the SDK's ``BatchJob`` drops ``batchStats``), read
        through the client's own request path (same base URL, key, timeout, errors)."""
        answer = self.client._api_client.request("get", name, {})
        body = json.loads(answer.body or "{}")
        return rest_batch_event(body if isinstance(body, Mapping) else {})

    def close(self) -> None:
        self.client.close()


# The details key of a batch's progress (``metadata.batchStats``, counts as integers).
BATCH_STATS_DETAIL = PROGRESS_DETAIL


def _count(value: object) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value.isdigit():
        return int(value)
    return None


def batch_stats(body: Mapping[str, Any]) -> dict[str, int] | None:
    """``metadata.batchStats`` of a REST batch resource (``requestCount``,
    ``successfulRequestCount``, ``failedRequestCount``, ``pendingRequestCount``; int64 counts
    arrive as text) as integers; None when it is not there."""
    metadata = body.get("metadata")
    stats = metadata.get("batchStats") if isinstance(metadata, Mapping) else None
    if not isinstance(stats, Mapping):
        return None
    out = {str(k): n for k, n in ((k, _count(v)) for k, v in stats.items()) if n is not None}
    return out or None


def rest_batch_event(body: Mapping[str, Any]) -> OpEvent:
    """A REST batch resource (polled or listed) as an event, its ``metadata.batchStats`` kept
    as the ``batch_stats`` detail."""
    event = from_batch_job(rest_batch_job(body))
    stats = batch_stats(body)
    if stats is None:
        return event
    return replace(event, details={**event.details, BATCH_STATS_DETAIL: stats})


def rest_batch_pages(client: Any, page_size: int) -> Iterator[Sequence[Listed]]:
    """The Gemini API's REST listing (``{"operations": [...], "nextPageToken"}``) page by page
    through the client's own request path, each job as ``rest_batch_event`` reads it or the
    ``EventError`` that refused it; a failure as ``classify`` says."""
    token: str | None = None
    while True:
        query: dict[str, Any] = {"pageSize": page_size}
        if token:
            query["pageToken"] = token
        try:
            answer = client._api_client.request("get", f"batches?{urlencode(query)}", {})
            body = json.loads(answer.body or "{}")
        except Exception as exc:
            raise classify(exc) from exc
        if not isinstance(body, Mapping):
            body = {}
        operations = body.get("operations")
        yield [_listed(item) for item in (operations if isinstance(operations, list) else [])]
        token = body.get("nextPageToken")
        if not isinstance(token, str) or not token:
            return


def _listed(item: object) -> Listed:
    resource = item if isinstance(item, Mapping) else {}
    raw_name = str(resource.get("name"))
    try:
        return raw_name, rest_batch_event(resource)
    except EventError as exc:
        return raw_name, exc


def rest_batch_job(body: Mapping[str, Any]) -> dict[str, Any]:
    """A REST batch resource (an LRO whose ``metadata`` is the batch) in the mapping form
    ``from_batch_job`` reads: ``name``, ``state``, ``updateTime``, ``displayName``,
    ``error``, ``dest.fileName``."""
    metadata = body.get("metadata")
    job: dict[str, Any] = dict(metadata) if isinstance(metadata, Mapping) else {}
    job["name"] = body.get("name") or job.get("name")
    if body.get("error") is not None:
        job["error"] = body["error"]
    output = job.get("output")
    if isinstance(output, Mapping) and output.get("responsesFile"):
        job["dest"] = {"fileName": output["responsesFile"]}
    return job


# --- the client ---------------------------------------------------------------------------------


def _secret_api_key(secret_id: str, max_age_s: int) -> str:
    from aws_lambda_powertools.utilities.parameters import get_secret
    from aws_lambda_powertools.utilities.parameters.exceptions import GetParameterError

    try:
        value = get_secret(secret_id, max_age=max_age_s)
    except GetParameterError as exc:
        raise ConfigError(f"could not read the Gemini API key secret: {exc}") from None
    text = value.strip() if isinstance(value, str) else ""
    if text.startswith("{"):
        try:
            parsed = json.loads(text)
        except ValueError:
            parsed = None
        if isinstance(parsed, Mapping):
            for key in SECRET_JSON_KEYS:
                candidate = parsed.get(key)
                if isinstance(candidate, str) and candidate.strip():
                    return candidate.strip()
        raise ConfigError(
            "the Gemini API key secret is JSON without a string under one of "
            + ", ".join(SECRET_JSON_KEYS)
        )
    if not text:
        raise ConfigError("the Gemini API key secret is empty")
    return text


def api_key(settings: Settings) -> str:
    """The Gemini API key: from Secrets Manager if an ARN is set, else ``GEMINI_API_KEY``."""
    if settings.gemini_api_key_secret_arn:
        return _secret_api_key(settings.gemini_api_key_secret_arn, settings.secrets_cache_s)
    if settings.gemini_api_key:
        return settings.gemini_api_key
    raise ConfigError(
        "no Gemini API key: set OPSTATE_GEMINI_API_KEY_SECRET_ARN (Secrets Manager) or "
        "GEMINI_API_KEY"
    )


def make_client(settings: Settings) -> genai.Client:
    """The google-genai client of the reconciler.

    The base URL is never passed here, so ``GOOGLE_GEMINI_BASE_URL`` (read by the SDK) points
    it at any server. Requests time out after ``reconcile_http_timeout_s`` and are never
    retried by the SDK (its default would retry a 429 for up to ~30 s): the run paces itself
    and leaves the operation for the next run.
    """
    from google import genai
    from google.genai import types

    options = types.HttpOptions(
        timeout=max(1, int(settings.reconcile_http_timeout_s * 1000)),
        retry_options=types.HttpRetryOptions(attempts=1),
    )
    return genai.Client(vertexai=False, api_key=api_key(settings), http_options=options)
