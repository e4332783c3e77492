"""The webhook's init: it keeps the cyclic GC away from what it builds (and always turns it back
on), and imports only what every request needs; the parts only some requests need are imported
by their first request.

Each case runs in a fresh interpreter (``gc.freeze`` and ``sys.modules`` are process-wide, so
not in the test process). benchmarks/bench_cold.py measures what this saves; nothing here is
timed.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.support.webhooks import TEST_SECRET, http_event, signed_headers

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


def run(code: str, **env: str) -> dict[str, Any]:
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
    answer: dict[str, Any] = json.loads(result.stdout.strip().splitlines()[-1])
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


# Modules (and their submodules) the webhook's init - the entry, then the app its first request
# uses - must not import (docs/api.md, "Cold start"): the reconciler's SDK and Google's auth;
# what Powertools' event handler package loads (asyncio, the event data classes, OpenAPI: the
# API routes with ``opstate.api.router``); the X-Ray SDK (tracing off); PyJWT and sqlite3; and
# the parts of the app that only some requests need, each imported by its first request.
NOT_AT_INIT = (
    "google.genai",
    "google.auth",
    "asyncio",
    "aws_lambda_powertools.event_handler",
    "aws_lambda_powertools.utilities.data_classes",
    "aws_lambda_powertools.utilities.parser",
    "pydantic",
    "aws_xray_sdk",
    "jwt",
    "sqlite3",
    "opstate.api.pubsub",  # the first Pub/Sub push
    "opstate.quarantine",  # the first signed delivery that cannot be read
    "opstate.private_files",
    "opstate.waiters",  # the first report that names a waiter
    "opstate.outcomes",  # the first GET of a record (its results view)
    "opstate.retry",  # the first report with a "retry" object, the first view of a lineage
    "opstate.domain.retry",  # the same (the policy's reading and views)
    "opstate.store.retry_state",  # the first retry read or write of a store
    "opstate.domain.events_polls",  # polled sources: the first Pub/Sub push (from_operation)
    "opstate.store.memory",  # memory:// only (tests)
    "opstate.signatures.jwt_tokens",
    "opstate.webhook_secrets.files",
    "opstate.webhook_secrets.rotation",
    "opstate.reconcile",
    "opstate.notify",
    "opstate.replay",
    "opstate.local",
    "opstate.cli",
    "tqdm",  # the CLI's progress bars (issue 49): never a function's
)

LOADED = (
    "def loaded(names):\n"
    "    return sorted(m for m in sys.modules\n"
    "                  if any(m == n or m.startswith(n + '.') for n in names))\n"
)

# The deployed function's settings (template.yaml): the quarantine queue, the waiters table and
# their ARNs, Pub/Sub push; a webhook or operations request needs none of them at init.
DEPLOYED = {
    "OPSTATE_QUARANTINE_QUEUE_URL": "https://sqs.us-east-1.amazonaws.com/123456789012/q",
    "OPSTATE_WAITERS_TABLE_NAME": "cold-start-waiters",
    "OPSTATE_WAITER_STATE_MACHINE_ARNS": "arn:aws:states:us-east-1:123456789012:stateMachine:w",
    "OPSTATE_PUBSUB_AUDIENCE": "https://example.invalid/google-cloud/pubsub",
    "OPSTATE_PUBSUB_EMAIL": "push@p1.iam.gserviceaccount.com",
}


@pytest.mark.parametrize("deployed", [False, True], ids=["bare", "deployed"])
def test_the_init_imports_only_what_every_request_needs(deployed: bool) -> None:
    answer = run(
        LOADED + "load_entry()\n"
        "from opstate.api import default_app\n"
        "default_app()\n"
        f"print(json.dumps({{'loaded': loaded({NOT_AT_INIT!r})}}))\n",
        OPSTATE_STORE="dynamodb://cold-start-test",
        AWS_ENDPOINT_URL_DYNAMODB="http://127.0.0.1:9",
        **(DEPLOYED if deployed else {}),
    )
    assert answer["loaded"] == []


def test_each_lazy_part_is_imported_by_its_first_request() -> None:
    """Through the Lambda entry: a webhook and a report import none of the lazy parts; a GET
    imports the results view, a report naming a waiter the waiters, a push the Pub/Sub
    receiver, an unreadable signed webhook the quarantine; each answers as it always did."""
    body = b'{"type": "batch.succeeded", "data": {"id": "batches/cold"}}'
    unreadable = b"{not json"
    steps = [
        (
            "webhook",
            http_event(
                "POST", "/gemini/webhook", body=body, headers=signed_headers(body, timestamp=None)
            ),
        ),
        ("report", http_event("PUT", "/operations/batches/cold", iam=True)),
        ("get", http_event("GET", "/operations/batches/cold", iam=True)),
        (
            "waiter",
            http_event(
                "PUT",
                "/operations/batches/cold",
                body=json.dumps({"waiter": {"taskToken": "t"}}).encode(),
                iam=True,
            ),
        ),
        ("push", http_event("POST", "/google-cloud/pubsub", body=b"{}")),
        (
            "unreadable",
            http_event(
                "POST",
                "/gemini/webhook",
                body=unreadable,
                headers=signed_headers(unreadable, timestamp=None),
            ),
        ),
    ]
    lazy = ["opstate.outcomes", "opstate.waiters", "opstate.api.pubsub", "opstate.quarantine"]
    answer = run(
        LOADED + "module = load_entry()\n"
        f"steps = json.loads({json.dumps(steps)!r})\n"
        "seen = {}\n"
        "for label, event in steps:\n"
        "    status = module.handle(event, None)['statusCode']\n"
        f"    seen[label] = [status, [n for n in {lazy!r} if loaded([n])]]\n"
        "print(json.dumps(seen))\n",
        OPSTATE_STORE="memory://",
        OPSTATE_WEBHOOK_SECRETS=TEST_SECRET,
    )
    assert answer == {
        "webhook": [200, []],
        "report": [200, []],
        "get": [200, ["opstate.outcomes"]],
        "waiter": [400, ["opstate.outcomes", "opstate.waiters"]],  # no ARNs: not enabled
        "push": [401, ["opstate.outcomes", "opstate.waiters", "opstate.api.pubsub"]],
        "unreadable": [200, lazy],
    }
