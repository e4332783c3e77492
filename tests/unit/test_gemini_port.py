"""The Gemini port (issue 49, ``opstate.gemini.port``): what opstate calls on a client, met by a
real ``google.genai.Client`` (checked here at run time as mypy checks it statically) and by the
tests' ``MemoryGemini``, which runs the submit, read, search, cancel and file calls of
``opstate.gemini`` at unit speed."""

from __future__ import annotations

import inspect

import pytest
from google import genai

from opstate.domain.states import State
from opstate.gemini.errors import GatewayError
from opstate.gemini.files import download, file_info
from opstate.gemini.port import BatchesApi, FilesApi, GeminiClient, RestApi
from opstate.gemini.submit import (
    cancel_batch,
    create_or_delete,
    find_by_display_id,
    read_batch,
    upload_jsonl,
)
from opstate.retry.acting import read_job
from tests.support.gemini_port import MemoryGemini, as_port

ROWS = b'{"key": "a", "request": {}}\n{"key": "b", "request": {}}\n'


def _methods(port: type) -> list[str]:
    return sorted(
        name for name, _ in inspect.getmembers(port, inspect.isfunction) if name[0] != "_"
    )


def test_a_real_client_has_every_call_of_the_port_keyword_only() -> None:
    client = genai.Client(api_key="not-used", vertexai=False)
    try:
        for port, real in ((BatchesApi, client.batches), (FilesApi, client.files)):
            for name in _methods(port):
                wanted = inspect.signature(getattr(port, name)).parameters
                have = inspect.signature(getattr(real, name)).parameters
                for parameter in (p for p in wanted.values() if p.name != "self"):
                    assert parameter.name in have, f"{port.__name__}.{name}({parameter.name})"
                    assert have[parameter.name].kind == parameter.kind, (name, parameter.name)
        rest = inspect.signature(client._api_client.request).parameters
        assert list(rest)[:3] == list(inspect.signature(RestApi.request).parameters)[1:]
    finally:
        client.close()
    assert _methods(BatchesApi) == ["cancel", "create", "get", "list"]
    assert _methods(FilesApi) == ["delete", "download", "get", "upload"]


def test_submit_read_find_and_cancel_through_the_port() -> None:
    gemini = MemoryGemini()
    client: GeminiClient = as_port(gemini)
    file_name = upload_jsonl(client, chunks=[ROWS], size=len(ROWS), display_name="opstate-s-1")
    event = create_or_delete(client, "models/gemini-2.5-flash", file_name, "run opstate-s-1")
    assert event.state is State.PENDING
    assert read_batch(client, event.name).state is State.PENDING
    assert find_by_display_id(client, "opstate-s-1", page_size=1) == [event.name]
    assert find_by_display_id(client, "opstate-s-10") == []  # a word, never a prefix
    job = read_job(client, event.name)
    assert job.carries("opstate-s-1") and job.model == "models/gemini-2.5-flash"
    cancel_batch(client, event.name)
    assert read_batch(client, event.name).state is State.CANCELLED
    assert not read_job(client, "batches/gone").found  # a 404 read as not found


def test_a_refused_create_deletes_its_upload() -> None:
    gemini = MemoryGemini()
    file_name = upload_jsonl(gemini, chunks=[ROWS], size=len(ROWS), display_name="opstate-s-2")
    gemini.refuse_create.append(400)
    with pytest.raises(GatewayError) as refused:
        create_or_delete(gemini, "models/gemini-2.5-flash", file_name, "opstate-s-2")
    assert refused.value.status == 400
    assert file_name not in gemini.stored_files
    assert ("files.delete", file_name) in gemini.calls


def test_files_are_read_and_streamed_through_the_port() -> None:
    gemini = MemoryGemini()
    name = upload_jsonl(gemini, chunks=[ROWS[:10], ROWS[10:]], size=len(ROWS), display_name="x")
    info = file_info(gemini, name)
    assert info.size == len(ROWS) and len(info.sha256) == 64
    got: list[bytes] = []
    download(gemini, name, got.append)
    assert b"".join(got) == ROWS
