"""The domain modules stay pure: importing them loads no AWS, Gemini, HTTP or pydantic code."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.unit.test_layers import DOMAIN as DOMAIN_PREFIXES
from tests.unit.test_layers import module_files

# Every existing domain module (the layer table in test_layers.py lists them once).
DOMAIN = sorted(
    m for m in module_files() if any(m == p or m.startswith(p + ".") for p in DOMAIN_PREFIXES)
)
FORBIDDEN = [
    "boto3",
    "botocore",
    "google",
    "pydantic",
    "aws_lambda_powertools",
    "urllib.request",
    "http",
]

_PROBE = """
import importlib, json, sys
for module in {modules!r}:
    importlib.import_module(module)
forbidden = {forbidden!r}
loaded = sorted(
    name for name in sys.modules
    if any(name == f or name.startswith(f + ".") for f in forbidden)
)
print(json.dumps({{"loaded": loaded, "ok": all(m in sys.modules for m in {modules!r})}}))
"""


def _probe(modules: list[str], forbidden: list[str]) -> dict[str, object]:
    code = _PROBE.format(modules=modules, forbidden=forbidden)
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    result: dict[str, object] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


@pytest.mark.parametrize("modules", [DOMAIN, *([m] for m in DOMAIN)], ids=["all", *DOMAIN])
def test_domain_imports_nothing_impure(modules: list[str]) -> None:
    result = _probe(modules, FORBIDDEN)
    assert result["ok"] is True
    assert result["loaded"] == []


def test_the_probe_can_fail() -> None:
    # A probe that never reports anything would make the test above worthless.
    result = _probe(["http.client"], FORBIDDEN)
    assert "http" in result["loaded"]  # type: ignore[operator]


def test_the_domain_list_is_read_from_the_layer_table() -> None:
    expected = {
        "opstate.domain.states",
        "opstate.domain.model",
        "opstate.domain.events",
        "opstate.domain.reducer",
    }
    assert expected | {"opstate.domain.views"} <= set(DOMAIN)
