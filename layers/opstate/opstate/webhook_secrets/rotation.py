"""Merging keys on registration and rotation: the new key first, and only the keys a rotation
provably made useless dropped."""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

from opstate.webhook_secrets.rule import SECRET_PREFIX

# A stored list never grows beyond this many keys (newest kept). Rotation prunes what Gemini
# revoked, so only many projects sharing one store come near it.
MAX_STORED_SECRETS = 32

_TRUNCATION = re.compile(r"\.{2,}|…|\*+")


def merge_new(new: str, existing: Sequence[str], limit: int = MAX_STORED_SECRETS) -> list[str]:
    """``new`` first, then ``existing`` (deduplicated), at most ``limit`` keys."""
    merged = [new]
    for key in existing:
        if key not in merged:
            merged.append(key)
    return merged[:limit]


def secret_matches(secret: str, truncated: str) -> bool:
    """Whether a full secret is the one a truncated form (``whsec_AbC...xYz``) shows."""
    if not truncated:
        return False
    parts = _TRUNCATION.split(truncated)
    if len(parts) == 1:
        return secret == truncated
    head, tail = parts[0], parts[-1]
    if not head and not tail:
        return False
    for candidate in (secret, secret.removeprefix(SECRET_PREFIX)):
        if (
            candidate.startswith(head)
            and candidate.endswith(tail)
            and len(candidate) >= len(head) + len(tail)
        ):
            return True
    return False


def revoked_by_rotation(
    stored: Sequence[str], new: str, listed_before: Sequence[str], listed_after: Sequence[str]
) -> set[str]:
    """The stored keys a rotation made useless: those the rotated webhook listed (truncated)
    before the rotation and no longer lists after it.

    Nothing else is ever dropped: keys of another Gemini project, or added by hand, match nothing
    this webhook listed before. When the answer cannot be trusted (the new secret matches nothing
    listed after the rotation, or an old key matches both lists) the key is kept: a key kept too
    long is harmless, one dropped too early loses deliveries.
    """
    if not any(secret_matches(new, t) for t in listed_after):
        return set()
    dropped: set[str] = set()
    for key in stored:
        if key == new:
            continue
        was_listed = any(secret_matches(key, t) for t in listed_before)
        still_listed = any(secret_matches(key, t) for t in listed_after)
        if was_listed and not still_listed:
            dropped.add(key)
    return dropped


def rotation_change(
    new: str, *, listed_before: Sequence[str] = (), listed_after: Sequence[str] = ()
) -> Callable[[Sequence[str]], list[str]]:
    """The change a register / rotate applies to the keys read right before writing: ``new``
    first, minus what ``revoked_by_rotation`` says this rotation made useless (decided on the
    keys as they are at write time, so a key another writer added meanwhile is kept)."""

    def change(current: Sequence[str]) -> list[str]:
        dropped = revoked_by_rotation(current, new, listed_before, listed_after)
        return merge_new(new, [k for k in current if k not in dropped])

    return change
