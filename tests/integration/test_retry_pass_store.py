"""Every store a retry pass runs on is a ``RetryPassStore`` (issue 49: the retry room takes
that port, no longer ``Any``), narrowed once at the edge (``retry.wiring.pass_store``, as
``check_keepable`` narrows to ``RetryingStore``); a store without retry states is refused with
a clear error before any Gemini client is made."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from opstate.config import ConfigError, Settings
from opstate.retry.wiring import pass_store, retry_from_settings, roots_of
from opstate.store.memory import MemoryStore
from opstate.store.port import RetryPassStore
from opstate.wiring.lineages import open_members
from tests.support.stores import STORE_KINDS, DelegatingStore, Harness, harness_of


@pytest.fixture(params=STORE_KINDS)
def harness(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Harness]:
    with harness_of(request, tmp_path) as h:
        yield h


def test_every_store_is_a_retry_pass_store(harness: Harness) -> None:
    assert isinstance(harness.store, RetryPassStore)
    assert pass_store(harness.store) is harness.store
    assert roots_of(harness.store, ["batches/none"]) == []
    assert open_members(harness.store).roots == 0


def test_a_store_without_retry_states_is_refused_by_name() -> None:
    bare = DelegatingStore(MemoryStore())  # records and polls only
    assert not isinstance(bare, RetryPassStore)
    for call in (
        lambda: pass_store(bare),
        lambda: roots_of(bare, ["batches/x"]),
        lambda: open_members(bare),
    ):
        with pytest.raises(ConfigError, match="DelegatingStore keeps no retry states"):
            call()


def test_the_pass_refuses_such_a_store_before_it_makes_a_client(tmp_path: Path) -> None:
    # No Gemini key is set: were the client made first, its error would say so instead.
    config = Settings.from_env(
        {
            "OPSTATE_STORE": f"sqlite:///{tmp_path}/ops.db",
            "OPSTATE_RESULTS_URL": f"file://{tmp_path}/results",
        }
    )
    bare = DelegatingStore(MemoryStore())
    with pytest.raises(ConfigError, match="keeps no retry states"):
        retry_from_settings(config, store=bare)
    with pytest.raises(ConfigError, match="no Gemini API key"):  # a store that keeps them
        retry_from_settings(config, store=MemoryStore())
