"""The source port on google-genai: the only module of the package importing ``google.genai``
(inside functions, so importing it stays cheap).

- batch: the REST resource itself (``GET batches/{id}``, through the client's own
  ``_api_client.request``: the SDK's ``BatchJob`` drops ``metadata.batchStats``, python-genai
  #1323), its ``metadata.output.responsesFile`` or ``inlinedResponses``, and
  ``batchStats.requestCount``;
- video: ``operations.get`` of a ``GenerateVideosOperation``: each generated video's file, the
  content-filtered count and reasons (``rai_media_filtered_*``);
- interaction: ``interactions.get``, the final resource as JSON;
- anything else: no output.

A batch's ``responsesFile`` is used only when it is a well-formed file name (``files/`` then
1-128 lowercase letters, digits or dashes, the Files API's id alphabet): anything else
(``files/abc/../../x``) would make the SDK request another path of the Gemini host with the
key, so it is refused (``SourceError``) before any request. Each Gemini file's
``expirationTime``, ``sizeBytes`` and ``sha256Hash`` come from ``files.get`` (the copy must
match them, ``opstate.outcomes.copy``); bytes are streamed by ``client.files.download`` into the
writer: both are ``opstate.gemini.files``'. SDK exceptions become ``SourceError`` through
``opstate.gemini.classify``; the key and the client are ``opstate.gemini``'s too.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import TYPE_CHECKING

from opstate.config import Settings
from opstate.domain.model import OpRecord
from opstate.domain.names import Kind, api_name
from opstate.gemini import client as gemini_client
from opstate.gemini.batches import batch_stats, rest_resource
from opstate.gemini.errors import classify
from opstate.gemini.files import download, file_info, file_name_of, is_file_name
from opstate.outcomes.ledger_reading import inlined_lines
from opstate.outcomes.source import (
    BATCH_OUTPUT,
    DOCUMENT,
    VIDEO,
    Output,
    Outputs,
    SourceError,
    Writer,
)

if TYPE_CHECKING:
    from google import genai


def checked_file_name(name: str) -> str:
    """``name`` when it is a well-formed Gemini file name (``files/<id>``); else
    ``SourceError``."""
    if not is_file_name(name):
        shown = name if len(name) <= 200 else f"{name[:200]}..."
        raise SourceError(
            f"Gemini names the output file {shown!r}, which is not a Gemini file name "
            "(files/<id>); nothing was requested"
        )
    return name


def _error(exc: BaseException) -> SourceError:
    if isinstance(exc, SourceError):
        return exc
    gateway_error = classify(exc)
    return SourceError(
        gateway_error.message, status=gateway_error.status, transient=gateway_error.transient
    )


class GenaiSource:
    """``Source`` over a ``google.genai.Client`` (see the module docstring)."""

    def __init__(self, client: genai.Client) -> None:
        self.client = client

    def outputs(self, record: OpRecord) -> Outputs:
        try:
            if record.kind is Kind.BATCH:
                return self._batch(record)
            if record.kind is Kind.VIDEO:
                return self._video(record)
            if record.kind is Kind.INTERACTION:
                return self._interaction(record)
        except Exception as exc:
            raise _error(exc) from exc
        return Outputs()

    def download(self, file: str, writer: Writer) -> None:
        try:
            download(self.client, file, writer.write)
        except Exception as exc:
            raise _error(exc) from exc

    def close(self) -> None:
        self.client.close()

    # -- kinds -------------------------------------------------------------------------------

    def _file(self, file: str, key: str, what: str) -> tuple[Output, int]:
        """The ``Output`` of Gemini file ``file`` with the size and sha256 ``files.get``
        declares, and its expirationTime (ns, 0: none)."""
        info = file_info(self.client, file)
        output = Output(key, what, file=file, size=info.size, sha256=info.sha256)
        return output, info.expiration_ns

    def _batch(self, record: OpRecord) -> Outputs:
        body = rest_resource(self.client, record.name)
        metadata = body.get("metadata")
        metadata = metadata if isinstance(metadata, Mapping) else {}
        stats = batch_stats(body) or {}
        requests = stats.get("requestCount")
        output = metadata.get("output")
        output = output if isinstance(output, Mapping) else {}
        file = output.get("responsesFile")
        if isinstance(file, str) and file:
            item, expiration = self._file(checked_file_name(file), "output.jsonl", BATCH_OUTPUT)
            return Outputs((item,), expiration_ns=expiration, requests=requests)
        inlined = output.get("inlinedResponses")
        items = inlined.get("inlinedResponses") if isinstance(inlined, Mapping) else None
        if isinstance(items, list):
            lines = inlined_lines([i for i in items if isinstance(i, Mapping)])
            data = b"".join(line + b"\n" for line in lines)
            return Outputs((Output("output.jsonl", BATCH_OUTPUT, data=data),), requests=requests)
        return Outputs(requests=requests)

    def _video(self, record: OpRecord) -> Outputs:
        from google.genai import types

        operation = types.GenerateVideosOperation.model_validate(
            {"name": api_name(record.name, record.details)}
        )
        answer = self.client.operations.get(operation)
        response = answer.response
        if response is None:
            return Outputs()
        items: list[Output] = []
        expiration = 0
        for index, generated in enumerate(response.generated_videos or []):
            uri = generated.video.uri if generated.video is not None else None
            file = file_name_of(uri) if uri else None
            if file is None:
                continue
            item, when = self._file(file, f"video-{index}.mp4", VIDEO)
            items.append(item)
            expiration = when if not expiration else min(expiration, when or expiration)
        reasons = tuple(str(r) for r in (response.rai_media_filtered_reasons or []))
        return Outputs(
            tuple(items),
            expiration_ns=expiration,
            filtered_count=response.rai_media_filtered_count,
            filtered_reasons=reasons,
        )

    def _interaction(self, record: OpRecord) -> Outputs:
        interaction_id = record.name.split("/", 1)[1]
        found = self.client.interactions.get(interaction_id)
        dump = getattr(found, "model_dump", None)
        document = dump(mode="json", exclude_none=True) if callable(dump) else dict(found)
        data = json.dumps(document, sort_keys=True, indent=1).encode("utf-8")
        return Outputs((Output("interaction.json", DOCUMENT, data=data),))


def make_client(settings: Settings) -> genai.Client:
    """The archiver's google-genai client (``opstate.gemini.make_client``): the reconciler's
    key, a per-read timeout of ``results_http_timeout_s`` (a download is many reads) and no SDK
    retries (the run retries a failed copy on its next pass). ``GOOGLE_GEMINI_BASE_URL`` points
    it at any server."""
    return gemini_client.make_client(settings, timeout_s=settings.results_http_timeout_s)
