"""The project's Gemini queue as opstate counts it (issue 46; docs/jobs.md, "The shared count"):
the tokens enqueued per model and the batches open, over every job's parts and every retry
batch, and the cap a refusal taught per model. Every runner (two ``retry --once``, serve beside
the CLI, two Lambda invocations) shares them through the store's counters (``CountingStore``,
SQLite and DynamoDB), which only grow:

- enqueued tokens of a model: ``job-enqueued:<model>:reserved`` less ``:freed``; a reservation
  is a conditional add to "reserved" capped at the model's cap plus what was freed (a stale
  read of "freed" only makes it stricter);
- open batches: ``job-batches:reserved`` less ``:freed``, the same way;
- a learned cap of a model: ``job-cap:<model>:<epoch>:lowered`` holds ``LEARN_BASE - cap``
  (a lower cap is a larger value: learning only adds), ``job-cap:<model>:epoch`` the epoch an
  operator's ``opstate retry --forget-cap MODEL`` moves on (a new epoch's counter is 0: no
  learned cap).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from opstate.config import SubmitSettings, model_id
from opstate.store.counters import CountingStore

RESERVED = "job-enqueued:{model}:reserved"
FREED = "job-enqueued:{model}:freed"
SLOTS_RESERVED = "job-batches:reserved"
SLOTS_FREED = "job-batches:freed"
CAP_EPOCH = "job-cap:{model}:epoch"
CAP_LOWERED = "job-cap:{model}:{epoch}:lowered"
# A counter's cap when nothing else bounds it (an int64).
NO_CAP = 2**62
# The largest cap a setting takes (``OPSTATE_SUBMIT_ENQUEUED_TOKENS``: at most 10^15); a learned
# cap ``c`` is kept as ``LEARN_BASE - c``.
MAX_ENQUEUED_TOKENS = 10**15
LEARN_BASE = MAX_ENQUEUED_TOKENS + 1
# Adds of a learned cap tried against other runners' adds.
MAX_LEARN_TRIES = 8


def enqueued(store: CountingStore, model: str) -> int:
    """The tokens of ``model`` opstate's batches hold in Gemini's queue now."""
    return store.get_counter(RESERVED.format(model=model)) - store.get_counter(
        FREED.format(model=model)
    )


def open_slots(store: CountingStore) -> int:
    """The batches opstate holds open in the project now (parts and retry batches)."""
    return store.get_counter(SLOTS_RESERVED) - store.get_counter(SLOTS_FREED)


def reserve(store: CountingStore, model: str, tokens: int, cap: int, max_batches: int) -> bool:
    """Take ``tokens`` of ``model``'s cap and one batch slot, both or neither."""
    freed = store.get_counter(FREED.format(model=model))
    if not store.add_counter(RESERVED.format(model=model), tokens, cap + freed):
        return False
    if store.add_counter(SLOTS_RESERVED, 1, max_batches + store.get_counter(SLOTS_FREED)):
        return True
    store.add_counter(FREED.format(model=model), tokens, NO_CAP)
    return False


def free(store: CountingStore, model: str, tokens: int) -> None:
    """Give back what ``reserve`` took (once: the caller wrote first that it is freed)."""
    store.add_counter(FREED.format(model=model), tokens, NO_CAP)
    store.add_counter(SLOTS_FREED, 1, NO_CAP)


def configured_cap(caps: tuple[tuple[str, int], ...], model: str) -> int:
    """The configured cap of ``model`` in ``caps`` (``SubmitSettings.submit_enqueued_tokens``;
    "*" when it is not listed)."""
    return SubmitSettings(submit_enqueued_tokens=caps).enqueued_cap(model)


def learned(store: CountingStore, model: str) -> int | None:
    """The cap a refusal taught for ``model`` (any job's), unless an operator forgot it."""
    model = model_id(model)
    epoch = store.get_counter(CAP_EPOCH.format(model=model))
    value = store.get_counter(CAP_LOWERED.format(model=model, epoch=epoch))
    return LEARN_BASE - value if 0 < value < LEARN_BASE else None


def learn(store: CountingStore, model: str, cap: int) -> None:
    """Keep ``cap`` as ``model``'s learned cap when it is lower than the one kept."""
    model = model_id(model)
    want = LEARN_BASE - max(1, min(cap, MAX_ENQUEUED_TOKENS))
    for _ in range(MAX_LEARN_TRIES):
        epoch = store.get_counter(CAP_EPOCH.format(model=model))
        counter = CAP_LOWERED.format(model=model, epoch=epoch)
        value = store.get_counter(counter)
        if value >= want or store.add_counter(counter, want - value, want):
            return


def forget(store: CountingStore, model: str) -> int | None:
    """Forget ``model``'s learned cap (``opstate retry --forget-cap``); the cap it had."""
    had = learned(store, model)
    store.add_counter(CAP_EPOCH.format(model=model_id(model)), 1, NO_CAP)
    return had


def cap_for(store: CountingStore, model: str, configured: int) -> int:
    """The cap ``model`` is fed under: the configured one, or a learned one below it."""
    taught = learned(store, model)
    return min(configured, taught) if taught is not None else configured


def reservation(found: object) -> dict[str, Any] | None:
    """A recorded reservation not yet freed (``{"model", "tokens"}``: a retry child's entry's,
    a batch submitted alone's), else None."""
    if not isinstance(found, Mapping) or found.get("freed"):
        return None
    model, tokens = found.get("model"), found.get("tokens")
    if not isinstance(model, str) or not isinstance(tokens, int) or isinstance(tokens, bool):
        return None
    return {"model": model, "tokens": tokens}
