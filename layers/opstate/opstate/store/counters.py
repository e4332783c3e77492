"""Counters a deployment keeps in its store beside the records (issue 41): what retries may
spend in a day (``OPSTATE_RETRY_DAILY_BUDGET_USD``), added to atomically under a cap so that
runners passing at once never go over it together.

A counter is an integer (nano-dollars for a spend) under a name. SQLite keeps them in a table
of their own (``counters``); DynamoDB in items of the operations table whose key starts with
``RESERVED_PREFIX`` (no record's canonical name can: ``domain.names`` never makes a ``#``),
holding only ``name`` and ``value``: no ``expires_at``, no queue or index key, so no Query or
filtered Scan of the store finds them, and the operator's listing (``iter_all``) and the
notifier (a stream record of such an item announces nothing) skip them by the prefix.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

RESERVED_PREFIX = "opstate#counter#"


def is_counter(name: object) -> bool:
    """Whether an item key is a counter's, not an operation's."""
    return isinstance(name, str) and name.startswith(RESERVED_PREFIX)


@runtime_checkable
class CountingStore(Protocol):
    """A store that keeps counters (SQLite, DynamoDB, memory)."""

    def add_counter(self, counter: str, amount: int, cap: int) -> bool:
        """Add ``amount`` (>= 0) to ``counter`` (0 when new) when the sum stays at most
        ``cap``, atomically; False (nothing added) when it would go over."""
        ...

    def get_counter(self, counter: str) -> int:
        """The counter's value (0 when it was never added to)."""
        ...
