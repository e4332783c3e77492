"""``MemoryGemini``: an in-memory Gemini behind ``opstate.gemini.port.GeminiClient`` (issue 49),
as ``gemini_memory.MemoryGateway`` is behind the reconciler's ``Gateway``: unit-speed tests of
the submit, read and file calls without the fake HTTP server (which, with a real client, stays
the tests' Gemini for whole passes).

Batches are kept in their REST form (an LRO whose ``metadata`` is the batch, as
``GET batches/{id}`` answers); ``batches.create`` answers the SDK's mapping form. Errors are
google-genai's own (``ClientError``), so ``opstate.gemini.classify`` reads them as it reads a
real client's. ``refuse_create`` makes the next creates fail with that status; ``calls`` lists
every call made.
"""

from __future__ import annotations

import hashlib
import io
import itertools
import json
from collections.abc import Mapping
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any
from urllib.parse import parse_qs, urlsplit

from google.genai import errors

from opstate.gemini.port import GeminiClient

_TIME = "2026-06-01T10:00:00Z"


def _error(code: int, status: str, message: str) -> errors.ClientError:
    return errors.ClientError(code, {"error": {"code": code, "status": status, "message": message}})


@dataclass
class _Answer:
    body: str | None


class _Batches:
    def __init__(self, gemini: MemoryGemini) -> None:
        self._g = gemini

    def get(self, *, name: str) -> Any:
        self._g.calls.append(("batches.get", name))
        return self._g.resource(name)["metadata"]

    def create(self, *, model: str, src: Any, config: Any = None) -> Any:
        self._g.calls.append(("batches.create", str(src)))
        if self._g.refuse_create:
            code = self._g.refuse_create.pop(0)
            raise _error(code, "FAILED_PRECONDITION", "refused by the memory Gemini")
        if src not in self._g.stored_files:
            raise _error(400, "INVALID_ARGUMENT", f"no file {src}")
        name = f"batches/m{next(self._g.ids)}"
        display = (config or {}).get("display_name", "")
        self._g.batches_by_name[name] = {
            "name": name,
            "metadata": {
                "name": name,
                "model": model,
                "displayName": display,
                "state": "BATCH_STATE_PENDING",
                "createTime": _TIME,
                "updateTime": _TIME,
                "inputConfig": {"fileName": src},
            },
        }
        return {"name": name, "state": "JOB_STATE_PENDING", "update_time": _TIME}

    def cancel(self, *, name: str) -> None:
        self._g.calls.append(("batches.cancel", name))
        self._g.resource(name)["metadata"]["state"] = "BATCH_STATE_CANCELLED"

    def list(self, *, config: Any = None) -> Any:
        raise NotImplementedError("the Gemini API's listing is read as REST (_api_client)")


class _Files:
    def __init__(self, gemini: MemoryGemini) -> None:
        self._g = gemini

    def upload(self, *, file: Any, config: Any = None) -> Any:
        data = b"".join(iter(lambda: file.read(1 << 20), b""))
        name = f"files/m{next(self._g.ids)}"
        self._g.calls.append(("files.upload", name))
        self._g.stored_files[name] = data
        return SimpleNamespace(name=name)

    def get(self, *, name: str) -> Any:
        self._g.calls.append(("files.get", name))
        data = self._file(name)
        return SimpleNamespace(
            name=name,
            size_bytes=len(data),
            sha256_hash=hashlib.sha256(data).hexdigest(),
            expiration_time=None,
        )

    def delete(self, *, name: str) -> Any:
        self._g.calls.append(("files.delete", name))
        self._file(name)
        del self._g.stored_files[name]

    def download(self, *, file: Any, destination: Any = None) -> Any:
        self._g.calls.append(("files.download", str(file)))
        data = self._file(str(file))
        if destination is None:
            return data
        assert isinstance(destination, io.IOBase)
        destination.write(data)
        return None

    def _file(self, name: str) -> bytes:
        if name not in self._g.stored_files:
            raise _error(404, "NOT_FOUND", f"{name} not found")
        return self._g.stored_files[name]


class _Rest:
    def __init__(self, gemini: MemoryGemini) -> None:
        self._g = gemini

    def request(self, http_method: str, path: str, request_dict: dict[str, object]) -> _Answer:
        self._g.calls.append((f"rest.{http_method}", path))
        parts = urlsplit(path)
        if http_method != "get":
            raise _error(405, "UNIMPLEMENTED", f"{http_method} {path}")
        if parts.path != "batches":
            return _Answer(json.dumps(self._g.resource(parts.path)))
        query = parse_qs(parts.query)
        size = int(query.get("pageSize", ["100"])[0])
        start = int(query.get("pageToken", ["0"])[0])
        names = list(reversed(self._g.batches_by_name))  # newest first, as Gemini lists
        held = [self._g.batches_by_name[n] for n in names[start:][:size]]
        page: dict[str, object] = {"operations": held}
        if start + size < len(names):
            page["nextPageToken"] = str(start + size)
        return _Answer(json.dumps(page))


class MemoryGemini:
    """An in-memory Gemini (the module docstring)."""

    def __init__(self) -> None:
        self.batches_by_name: dict[str, dict[str, Any]] = {}
        self.stored_files: dict[str, bytes] = {}
        self.calls: list[tuple[str, str]] = []
        self.refuse_create: list[int] = []
        self.ids = itertools.count(1)
        self._batches = _Batches(self)
        self._files = _Files(self)
        self._rest = _Rest(self)

    @property
    def batches(self) -> _Batches:
        return self._batches

    @property
    def files(self) -> _Files:
        return self._files

    @property
    def _api_client(self) -> _Rest:
        return self._rest

    def resource(self, name: str) -> dict[str, Any]:
        if name not in self.batches_by_name:
            raise _error(404, "NOT_FOUND", f"{name} not found")
        return self.batches_by_name[name]

    def set_state(self, name: str, state: str, **metadata: Mapping[str, Any] | str) -> None:
        """Move batch ``name`` to ``BATCH_STATE_<state>`` (and set other metadata fields)."""
        found = self.resource(name)["metadata"]
        found.update(metadata, state=f"BATCH_STATE_{state}")


def as_port(gemini: MemoryGemini) -> GeminiClient:
    """``gemini`` as the port (mypy checks that ``MemoryGemini`` fills ``GeminiClient``)."""
    return gemini
