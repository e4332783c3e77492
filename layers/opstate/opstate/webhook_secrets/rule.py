"""The rule for stored webhook secrets: what a key is, how a stored value is parsed into keys
(and ignored positions), and how keys are rendered for storing. See the package docstring."""

from __future__ import annotations

import base64
import binascii
import json
import re
import secrets as secrets_module
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

SECRET_PREFIX = "whsec_"
MIN_KEY_BYTES = 24
GENERATED_KEY_BYTES = 32

_BASE64_BODY = re.compile(r"[A-Za-z0-9+/]+={0,2}", re.ASCII)

KEY_RULE = f"'{SECRET_PREFIX}' + base64 of at least {MIN_KEY_BYTES} bytes"


class SecretStoreError(Exception):
    """A secret store could not be read or written. The message names the store, never a value."""


class SecretConflictError(SecretStoreError):
    """Concurrent writers kept changing the stored secrets; nothing was lost, nothing written."""


def secret_key(entry: str) -> bytes | None:
    """The HMAC key a stored entry stands for, or None when the entry is not a key."""
    if not entry.startswith(SECRET_PREFIX):
        return None
    body = entry[len(SECRET_PREFIX) :]
    if _BASE64_BODY.fullmatch(body) is None:
        return None
    try:
        key = base64.b64decode(body + "=" * (-len(body) % 4), validate=True)
    except (binascii.Error, ValueError):
        return None
    return key if len(key) >= MIN_KEY_BYTES else None


def is_key(entry: str) -> bool:
    return secret_key(entry) is not None


def generate_secret() -> str:
    """A new key: ``whsec_`` + base64 of 32 random bytes (the shape Gemini issues)."""
    raw = secrets_module.token_bytes(GENERATED_KEY_BYTES)
    return SECRET_PREFIX + base64.b64encode(raw).decode("ascii")


@dataclass(frozen=True, slots=True)
class ParsedSecrets:
    """The keys of a stored value (newest first, deduplicated) and where the ignored entries
    were (positions only: a value is never kept or shown)."""

    keys: tuple[str, ...]
    ignored: tuple[str, ...] = ()

    def warnings(self, where: str) -> list[str]:
        """One sentence per ignored entry, naming ``where`` and the entry's position."""
        return [
            f"{where}: {position} is not a webhook secret ({KEY_RULE}); ignored"
            for position in self.ignored
        ]


def _collect(entries: Iterable[tuple[str, object]]) -> ParsedSecrets:
    keys: list[str] = []
    ignored: list[str] = []
    for position, entry in entries:
        if not isinstance(entry, str):
            ignored.append(position)
            continue
        text = entry.strip()
        if not text or text.startswith("#"):
            continue
        if not is_key(text):
            ignored.append(position)
        elif text not in keys:
            keys.append(text)
    return ParsedSecrets(tuple(keys), tuple(ignored))


def _text_entries(text: str) -> Iterator[tuple[str, str]]:
    for lineno, line in enumerate(text.splitlines(), start=1):
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue  # a comment is skipped whole, whatever it holds
        words = stripped.split()
        if len(words) == 1:
            yield f"line {lineno}", words[0]
        else:
            for index, word in enumerate(words, start=1):
                yield f"line {lineno}, entry {index}", word


def parse_stored(value: str | bytes | Sequence[object]) -> ParsedSecrets:
    """The keys of a stored value: text (one secret per line), a JSON list of strings, bytes
    (UTF-8 text or JSON), or an already split sequence of entries."""
    if isinstance(value, bytes | bytearray):
        value = bytes(value).decode("utf-8", "replace")
    if isinstance(value, str):
        stripped = value.strip()
        if stripped.startswith("["):
            try:
                loaded = json.loads(stripped)
            except (ValueError, RecursionError):
                loaded = None
            if isinstance(loaded, list):
                return parse_stored(loaded)
        return _collect(_text_entries(value))
    return _collect((f"entry {i}", item) for i, item in enumerate(value, start=1))


def require_keys(keys: Iterable[str]) -> list[str]:
    """``keys`` as a list, after checking every one is a key (writers call this first)."""
    checked = list(keys)
    for position, entry in enumerate(checked, start=1):
        if not is_key(entry):
            raise ValueError(f"refusing to store entry {position}: it is not a key ({KEY_RULE})")
    return checked


def render_json(keys: Iterable[str]) -> str:
    """The Secrets Manager value: a JSON list of keys, newest first."""
    return json.dumps(require_keys(keys))


def render_text(keys: Iterable[str]) -> str:
    """The local file's content: one key per line, newest first, nothing else."""
    return "".join(f"{k}\n" for k in require_keys(keys))
