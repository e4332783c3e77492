"""Gemini's Files API: what a file declares (``files.get``) and streaming its bytes
(``files.download``), and the names and digests those calls use.

- ``file_name_of``: ``files/<id>`` of a file URI or name; ``is_file_name``: whether a name is
  a well-formed ``files/<id>`` (1-128 lowercase letters, digits or dashes, the Files API's id
  alphabet), so nothing else is ever requested with the key;
- ``sha256_hex``: Gemini's ``sha256Hash`` as a hex digest;
- ``file_info``: ``files.get``: the declared size, sha256 and expiration of a file;
- ``download``: ``client.files.download(file=..., destination=...)``, which writes 1 MiB chunks
  into any object with ``write`` (``BaseApiClient.download_file``: an httpx streamed response).

SDK exceptions pass through as they are: the caller turns them into its own error
(``opstate.gemini.classify``).
"""

from __future__ import annotations

import base64
import binascii
import io
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from opstate.domain.times import parse_time
from opstate.gemini.port import GeminiClient

_FILE_ID = re.compile(r"files/([a-z0-9-]+)")
_FILE_NAME = re.compile(r"files/[a-z0-9-]{1,128}")
_HEX_SHA256 = re.compile(r"[0-9a-fA-F]{64}")


def file_name_of(uri: str) -> str | None:
    """``files/<id>`` of a Gemini file URI or name (``.../v1beta/files/abc:download?...``)."""
    match = _FILE_ID.search(uri)
    return f"files/{match.group(1)}" if match else None


def is_file_name(name: str) -> bool:
    """Whether ``name`` is a well-formed Gemini file name (``files/<id>``)."""
    return _FILE_NAME.fullmatch(name) is not None


def sha256_hex(value: str | None) -> str:
    """Gemini's ``sha256Hash`` as a hex digest: base64 of the hex digest (what Gemini's files
    carry), base64 of the 32-byte digest, or the hex digest itself; "" for anything else
    (then it is not compared)."""
    text = (value or "").strip()
    if _HEX_SHA256.fullmatch(text):
        return text.lower()
    try:
        raw = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        return ""
    if len(raw) == 32:
        return raw.hex()
    decoded = raw.decode("ascii", "replace")
    return decoded.lower() if _HEX_SHA256.fullmatch(decoded) else ""


@dataclass(frozen=True, slots=True)
class FileInfo:
    """What ``files.get`` declares of a file: its size in bytes (None: not said), its sha256
    as hex ("": not said or unreadable) and when Gemini deletes it (ns, 0: not said)."""

    size: int | None
    sha256: str
    expiration_ns: int


def file_info(client: GeminiClient, name: str) -> FileInfo:
    """``files.get`` of ``name`` (a ``google.genai.Client``'s)."""
    found = client.files.get(name=name)
    when = found.expiration_time
    size = found.size_bytes if isinstance(found.size_bytes, int) else None
    return FileInfo(
        size=size,
        sha256=sha256_hex(found.sha256_hash),
        expiration_ns=parse_time(when.isoformat()) if when is not None else 0,
    )


class _Into(io.RawIOBase):
    """A ``write`` callable as the binary stream ``files.download`` is typed to take."""

    def __init__(self, write: Callable[[bytes], object]) -> None:
        super().__init__()
        self._write = write

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        chunk = data if isinstance(data, bytes) else bytes(data)
        self._write(chunk)
        return len(chunk)


def download(client: GeminiClient, name: str, write: Callable[[bytes], object]) -> None:
    """Stream file ``name``'s bytes into ``write``, chunk by chunk (never the whole file held)."""
    client.files.download(file=name, destination=_Into(write))
