"""Reading batch jobs: the Gemini API's REST resource with its ``batchStats``, and the SDK's
pager (Google Cloud's listing).

- ``rest_batch_pages``: the REST listing (``GET batches?pageSize=n&pageToken=t``) through the
  client's own request path (same base URL, key, timeout, errors), one page per step, each job
  read as one polled job is (``rest_batch_event``);
- ``rest_batch_event``: a REST batch resource (an LRO whose ``metadata`` is the batch) as an
  event, its ``metadata.batchStats`` kept as the ``batch_stats`` detail (the SDK's ``BatchJob``
  drops it, python-genai #1323); ``batch_stats`` reads those counts;
- ``batch_job_pages``: ``client.batches.list`` page by page (the SDK keeps a Cloud job's
  ``completionStats``).

A job the normalisers refuse comes back as its ``EventError`` beside its raw name
(``Listed``); a failed request as ``classify`` says.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import replace
from typing import Any
from urllib.parse import urlencode

from opstate.domain.events import EventError, from_batch_job
from opstate.domain.model import OpEvent
from opstate.domain.views import PROGRESS_DETAIL
from opstate.gemini.errors import GatewayError, classify
from opstate.gemini.port import GeminiClient

# One listed batch job: its raw name and either its event or why it was refused.
Listed = tuple[str, OpEvent | EventError]

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


def rest_batch_event(body: Mapping[str, Any]) -> OpEvent:
    """A REST batch resource (polled or listed) as an event, its ``metadata.batchStats`` kept
    as the ``batch_stats`` detail."""
    event = from_batch_job(rest_batch_job(body))
    stats = batch_stats(body)
    if stats is None:
        return event
    return replace(event, details={**event.details, BATCH_STATS_DETAIL: stats})


def rest_resource(client: GeminiClient, name: str) -> Mapping[str, Any]:
    """The REST resource of ``name`` (``GET {name}``) as a mapping ({} for anything else), read
    through the client's own request path (same base URL, key, timeout, errors)."""
    answer = client._api_client.request("get", name, {})
    body = json.loads(answer.body or "{}")
    return body if isinstance(body, Mapping) else {}


def rest_batch(client: GeminiClient, name: str) -> OpEvent:
    """One batch from its REST resource (``GET batches/{id}``)."""
    return rest_batch_event(rest_resource(client, name))


def rest_listing(client: GeminiClient, page_size: int) -> Iterator[list[object]]:
    """The Gemini API's REST listing (``GET batches?pageSize&pageToken``: ``{"operations":
    [...], "nextPageToken"}``) page by page, each page's raw items, through the client's own
    request path; a failure as ``classify`` says."""
    for page, _token in rest_listing_tokens(client, page_size):
        yield page


def rest_listing_tokens(
    client: GeminiClient, page_size: int
) -> Iterator[tuple[list[object], str | None]]:
    """``rest_listing`` with each page's next-page token (None on the last page), so a caller
    can bound the listing (a token seen before, a page cap) before the next page is asked."""
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
        token = body.get("nextPageToken")
        if not isinstance(token, str) or not token:
            token = None
        yield (list(operations) if isinstance(operations, list) else []), token
        if token is None:
            return


def rest_batch_pages(client: GeminiClient, page_size: int) -> Iterator[Sequence[Listed]]:
    """``rest_listing`` with each job as ``rest_batch_event`` reads it or the ``EventError``
    that refused it."""
    for page in rest_listing(client, page_size):
        yield [_listed(item) for item in page]


def _listed(item: object) -> Listed:
    resource = item if isinstance(item, Mapping) else {}
    raw_name = str(resource.get("name"))
    try:
        return raw_name, rest_batch_event(resource)
    except EventError as exc:
        return raw_name, exc


def batch_job_pages(
    client: GeminiClient, page_size: int, classify: Callable[[BaseException], GatewayError]
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


def input_file_of(item: object) -> str:
    """``metadata.inputConfig.fileName`` of a batch's REST resource (or listed item); "" when
    it has none (an inlined input)."""
    metadata = item.get("metadata") if isinstance(item, Mapping) else None
    config = metadata.get("inputConfig") if isinstance(metadata, Mapping) else None
    file_name = config.get("fileName") if isinstance(config, Mapping) else None
    return file_name if isinstance(file_name, str) else ""
