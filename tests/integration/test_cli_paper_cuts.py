"""The newcomer's small untruths (issue 49), each as it was seen:

- a short ``OPSTATE_API_TOKEN`` in the environment blocked every command; only ``serve`` uses
  it, so only ``serve`` checks it;
- a budget stop printed a raw Powertools JSON line on ``retry --once``: now an ``opstate:``
  line;
- ``get`` and ``results`` in text mode printed nested dicts as JSON, and ``get ROOT`` showed
  neither the final result nor what the lineage cost.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from opstate.domain.costs import shown_usd
from tests.integration.test_retry_engine import Rig, make_rig
from tests.integration.test_retry_spend import answered, batch_price
from tests.support.cli import Result, in_process
from tests.support.fake_gemini import FakeGemini
from tests.support.retry_rows import failed

SHORT = "short-token"


@pytest.fixture
def run(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> Callable[..., Result]:
    for key in ("OPSTATE_STORE", "OPSTATE_TABLE_NAME", "OPSTATE_WEBHOOK_SECRETS"):
        monkeypatch.delenv(key, raising=False)
    return in_process(monkeypatch, capsys)


def test_a_short_api_token_blocks_serve_alone(run: Callable[..., Result], tmp_path: Path) -> None:
    env = {"OPSTATE_API_TOKEN": SHORT}
    store = f"sqlite:///{tmp_path / 'ops.db'}"
    assert run("track", "batches/a", "--store", store, env=env).code == 0
    code, out, err = run("list", "--store", store, env=env)
    assert code == 0 and "batches/a" in out, err
    code, _, err = run(
        "serve", "--port", "0", "--store", f"sqlite:///{tmp_path / 'served.db'}", env=env
    )
    assert code == 2
    assert "configuration error: OPSTATE_API_TOKEN must be at least 32 characters" in err
    assert SHORT not in err
    assert not (tmp_path / "served.db").exists()  # refused before anything is created


@pytest.fixture
def rig(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: Any, fake_gemini: FakeGemini
) -> Iterator[Rig]:
    yield from make_rig(monkeypatch, tmp_path, capsys, fake_gemini)


def _stopped_root(rig: Rig) -> str:
    """A root whose retry the lineage's cap refuses (test_retry_spend's case)."""
    keys = [f"k{i}" for i in range(5)]
    cap = float(batch_price(3) / 2)
    root = rig.submit(keys, "--retry-attempts", "2", "--max-cost-usd", f"{cap!r}")
    rig.finish(
        root, [failed(k, 503, "UNAVAILABLE") for k in keys[:2]] + [answered(k) for k in keys[2:]]
    )
    return root


def test_a_budget_stop_is_an_opstate_line(rig: Rig) -> None:
    root = _stopped_root(rig)
    code, out, err = rig.cli("retry", "--once")
    assert code == 0 and '"stopped": 1' in out
    (line,) = err.splitlines()
    assert line.startswith(f"opstate: retry lineage stopped: name {root}; why ")
    assert "the retry budget stopped it: the lineage cost $0.000360 so far" in line
    assert "{" not in err and '"level"' not in err


def _no_json_lines(text: str) -> None:
    for line in text.splitlines():
        assert '{"' not in line and '["' not in line and "[{" not in line, line


def test_get_and_results_text_read_as_text_and_get_root_shows_final_and_cost(rig: Rig) -> None:
    root = _stopped_root(rig)
    code, before, _ = rig.cli("get", root)
    assert code == 0
    _no_json_lines(before)
    lines = before.splitlines()
    # before the final result: its status, and what the lineage cost so far
    assert lines[lines.index("final") + 1].split() == ["status", "pending"]
    assert any(line.split() == ["usd", str(shown_usd(batch_price(3)))] for line in lines)
    assert "  cost so far" in before

    assert rig.cli("retry", "--once").code == 0
    code, text, _ = rig.cli("get", root)
    assert code == 0
    _no_json_lines(text)
    lines = text.splitlines()
    final = lines[lines.index("final") :]
    assert final[1].split() == ["status", "final"]
    assert ["answered", "3"] in [line.split() for line in final]
    assert ["failed", "2"] in [line.split() for line in final]
    assert "  cost" in final and ["usd", str(shown_usd(batch_price(3)))] in [
        line.split() for line in final
    ]
    assert any(line.strip().startswith("stopped") and "budget" in line for line in final)
    assert "    - name -, attempt 1, rows 2, phase refused" in lines  # the refused child

    code, text, _ = rig.cli("results", root)
    assert code == 0
    _no_json_lines(text)
    lines = text.splitlines()
    assert "rows" in lines and ["succeeded", "3"] in [line.split() for line in lines]
    assert any(line.startswith("  - location file://") for line in lines)  # one per object
