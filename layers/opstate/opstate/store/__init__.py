"""Stores behind one small port: DynamoDB (production), SQLite (embedded), memory (tests)."""

from opstate.store.memory import MemoryStore
from opstate.store.port import (
    WRITTEN,
    RetryableError,
    Store,
    StoreUnavailableError,
    WriteOutcome,
)

__all__ = [
    "WRITTEN",
    "MemoryStore",
    "RetryableError",
    "Store",
    "StoreUnavailableError",
    "WriteOutcome",
]
