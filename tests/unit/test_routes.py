"""The API's paths have one home, ``opstate.domain.routes``, which ``template.yaml`` agrees with."""

from __future__ import annotations

from pathlib import Path

from opstate.domain.routes import OPERATIONS_PATH, OPERATIONS_PREFIX, PUBSUB_PATH, WEBHOOK_PATH
from opstate.local.apigw import build_event

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "layers" / "opstate" / "opstate"


def test_the_template_declares_the_same_paths() -> None:
    template = (ROOT / "template.yaml").read_text(encoding="utf-8")
    assert f"Path: {WEBHOOK_PATH}\n" in template
    assert f"Path: {PUBSUB_PATH}\n" in template
    assert template.count(f"Path: {OPERATIONS_PATH}\n") == 2  # GET and PUT


def test_local_events_carry_the_route_keys_of_the_template() -> None:
    webhook = build_event("POST", WEBHOOK_PATH, [], b"{}")
    assert webhook["routeKey"] == f"POST {WEBHOOK_PATH}"
    pubsub = build_event("POST", PUBSUB_PATH, [], b"{}")
    assert pubsub["routeKey"] == f"POST {PUBSUB_PATH}"
    get = build_event("GET", f"{OPERATIONS_PREFIX}batches/b1", [], b"")
    assert get["routeKey"] == f"GET {OPERATIONS_PATH}"
    assert get["pathParameters"] == {"name": "batches/b1"}


def test_no_module_spells_a_path_out_again() -> None:
    copies = [
        str(path.relative_to(PACKAGE))
        for path in PACKAGE.rglob("*.py")
        if path.name != "routes.py"
        and any(
            literal in path.read_text(encoding="utf-8")
            for literal in (
                f'"{WEBHOOK_PATH}"',
                f'"{PUBSUB_PATH}"',
                f'"{OPERATIONS_PREFIX}"',
                f'"{OPERATIONS_PATH}"',
                "/operations/{{name+}}",  # the route key in an f-string
            )
        )
    ]
    assert copies == []
