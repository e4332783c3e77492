"""The Gemini port: what opstate calls on a Gemini client, and nothing more.

``GeminiClient`` copies google-genai's nesting (``client.batches.get(name=...)``,
``client.files.upload(file=..., config=...)``): keyword-only methods, one object per resource,
so a real ``google.genai.Client`` fills it as it is (``_real_client_fits`` below has mypy check
that on every run: a google-genai release that renames or drops a method we call fails the type
check, not a deployment). SDK values (``BatchJob``, ``File``, a pager) stay ``Any``: the method
list is what matters.

- ``BatchesApi``: ``get``, ``create``, ``cancel``, ``list`` (the SDK's pager; Google Cloud's
  listing);
- ``FilesApi``: ``upload``, ``get``, ``delete``, ``download`` (into a writable stream);
- ``RestApi``: the one private need, ``client._api_client.request(method, path, body)``: the
  REST resource of a batch with its ``batchStats`` (the SDK's ``BatchJob`` drops them,
  python-genai #1323) and the REST listing (``opstate.gemini.batches``), through the client's
  own base URL, key, timeout and errors. Named here once, so a reader sees the one place
  opstate reaches under the SDK's public surface.

The fakes behind it: the tests' fake Gemini HTTP server with a real client
(``tests/support/fake_gemini.py``) and ``tests/support/gemini_port.py``'s ``MemoryGemini``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from google import genai


class BatchesApi(Protocol):
    """``client.batches``: the batch calls opstate makes."""

    def get(self, *, name: str) -> Any: ...

    def create(self, *, model: str, src: Any, config: Any = ...) -> Any: ...

    def cancel(self, *, name: str) -> None: ...

    def list(self, *, config: Any = ...) -> Any: ...


class FilesApi(Protocol):
    """``client.files``: the Files API calls opstate makes."""

    def upload(self, *, file: Any, config: Any = ...) -> Any: ...

    def get(self, *, name: str) -> Any: ...

    def delete(self, *, name: str) -> Any: ...

    def download(self, *, file: Any, destination: Any = ...) -> Any: ...


class RestAnswer(Protocol):
    """What ``RestApi.request`` answers: the raw JSON body (None: empty)."""

    @property
    def body(self) -> str | None: ...


class RestApi(Protocol):
    """``client._api_client``: a request through the client's own transport."""

    def request(self, http_method: str, path: str, request_dict: dict[str, object]) -> RestAnswer:
        """``http_method`` of ``path`` relative to the API version's base URL
        (``batches/x``, ``batches?pageSize=n``); a failed request raises the SDK's error."""
        ...


class GeminiClient(Protocol):
    """A Gemini client as opstate uses it (the module docstring)."""

    @property
    def batches(self) -> BatchesApi: ...

    @property
    def files(self) -> FilesApi: ...

    @property
    def _api_client(self) -> RestApi: ...


if TYPE_CHECKING:

    def _real_client_fits(client: genai.Client) -> GeminiClient:
        """Never called: mypy checks that a real client fills the port."""
        return client
