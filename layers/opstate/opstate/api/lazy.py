"""``OnFirstUse``: a part of the app built by the first request that needs it, not at init.

The Lambda's init builds only what every request needs; the Pub/Sub receiver (PyJWT when
configured) and the waiters' registrar (the waiters code, a second DynamoDB client) are built
on the first push or the first report that names a waiter (docs/api.md, "Cold start")."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import cast


class OnFirstUse[T]:
    """``build()``'s value, built once on the first ``get()`` (threads wait for one build; a
    build that raises is tried again by the next ``get()``)."""

    __slots__ = ("_build", "_built", "_lock", "_value")

    def __init__(self, build: Callable[[], T]) -> None:
        self._build = build
        self._lock = threading.Lock()
        self._built = False
        self._value: T | None = None

    @classmethod
    def ready(cls, value: T) -> OnFirstUse[T]:
        """One whose value is already there."""
        made = cls(lambda: value)
        made._value, made._built = value, True
        return made

    def get(self) -> T:
        if not self._built:
            with self._lock:
                if not self._built:
                    self._value = self._build()
                    self._built = True
        return cast("T", self._value)
