"""The webhook's init keeps the cyclic GC away from what it builds, and always turns it back on.

Each case runs in a fresh interpreter (``gc.freeze`` is process-wide, so not in the test
process). benchmarks/bench_cold.py measures what this saves; nothing here is timed.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ENTRY = ROOT / "functions" / "webhook" / "app.py"
LAYER = ROOT / "layers" / "opstate"
SECRET = "whsec_Y29sZC1zdGFydC10ZXN0LXNlY3JldC0zMi1ieXRlcyE="

PRELUDE = f"""
import gc, importlib.util, json, sys
sys.path.insert(0, {str(LAYER)!r})
def load_entry():
    spec = importlib.util.spec_from_file_location("webhook_entry", {str(ENTRY)!r})
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
"""


def run(code: str, **env: str) -> dict[str, object]:
    result = subprocess.run(
        [sys.executable, "-c", PRELUDE + code],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        env={
            "PATH": "/usr/bin:/bin",
            "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "POWERTOOLS_TRACE_DISABLED": "true",
            "OPSTATE_WEBHOOK_SECRETS": SECRET,
            **env,
        },
    )
    assert result.returncode == 0, result.stderr
    answer: dict[str, object] = json.loads(result.stdout.strip().splitlines()[-1])
    return answer


def test_entry_init_freezes_what_it_imported_and_reenables_the_gc() -> None:
    answer = run(
        "load_entry()\n"
        "print(json.dumps({'enabled': gc.isenabled(), 'frozen': gc.get_freeze_count()}))\n",
        OPSTATE_STORE="memory://",
    )
    assert answer["enabled"] is True
    assert isinstance(answer["frozen"], int) and answer["frozen"] > 10_000


@pytest.mark.parametrize("store", ["memory://", "dynamodb://cold-start-test"])
def test_building_the_app_freezes_it_and_reenables_the_gc(store: str) -> None:
    answer = run(
        "module = load_entry()\n"
        "before = gc.get_freeze_count()\n"
        "from opstate.api import default_app\n"
        "app = default_app()\n"
        "frozen = gc.get_freeze_count()\n"
        "default_app()\n"  # cached: nothing more is frozen
        "print(json.dumps({'enabled': gc.isenabled(), 'grew': frozen > before,\n"
        "                  'again': gc.get_freeze_count() == frozen}))\n",
        OPSTATE_STORE=store,
        AWS_ENDPOINT_URL_DYNAMODB="http://127.0.0.1:9",
    )
    assert answer == {"enabled": True, "grew": True, "again": True}


def test_a_failed_build_leaves_the_gc_on_and_the_next_request_retries() -> None:
    answer = run(
        "from opstate.api import default_app\n"
        "errors = []\n"
        "for _ in range(2):\n"
        "    try:\n"
        "        default_app()\n"
        "    except ValueError as exc:\n"
        "        errors.append(type(exc).__name__)\n"
        "print(json.dumps({'enabled': gc.isenabled(), 'errors': errors}))\n",
        OPSTATE_STORE="nosuchstore://x",
    )
    assert answer == {"enabled": True, "errors": ["ValueError", "ValueError"]}


def test_building_the_app_keeps_a_disabled_gc_disabled() -> None:
    answer = run(
        "gc.disable()\n"
        "from opstate.api import default_app\n"
        "default_app()\n"
        "print(json.dumps({'enabled': gc.isenabled()}))\n",
        OPSTATE_STORE="memory://",
    )
    assert answer == {"enabled": False}


def test_a_bad_setting_fails_the_init_with_the_gc_back_on() -> None:
    answer = run(
        "from opstate.config import ConfigError\n"
        "try:\n"
        "    load_entry()\n"
        "except ConfigError as exc:\n"
        "    error = str(exc)\n"
        "print(json.dumps({'enabled': gc.isenabled(), 'error': error}))\n",
        OPSTATE_STORE="memory://",
        OPSTATE_RECONCILE_SAFETY_MARGIN_SECONDS="nan",
    )
    assert answer["enabled"] is True
    assert "OPSTATE_RECONCILE_SAFETY_MARGIN_SECONDS" in str(answer["error"])


def test_the_tracer_instruments_only_aws_calls_and_http_client() -> None:
    """With tracing on (as in Lambda), the Tracer patches botocore and http.client only: the
    other modules the X-Ray SDK supports are not imported at init just to be patched."""
    answer = run(
        "import aws_xray_sdk.core as xray\n"
        "calls = []\n"
        "patch, patch_all = xray.patch, xray.patch_all\n"
        "xray.patch = lambda modules, **kw: (calls.append(sorted(modules)), patch(modules, **kw))\n"
        "xray.patch_all = lambda **kw: (calls.append('all'), patch_all(**kw))\n"
        "load_entry()\n"
        "print(json.dumps({'calls': calls, 'requests': 'requests' in sys.modules}))\n",
        OPSTATE_STORE="memory://",
        POWERTOOLS_TRACE_DISABLED="false",
        LAMBDA_TASK_ROOT=str(ENTRY.parent),
        AWS_XRAY_CONTEXT_MISSING="LOG_ERROR",
    )
    assert answer == {"calls": [["botocore", "httplib"]], "requests": False}
