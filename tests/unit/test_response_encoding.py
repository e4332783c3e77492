"""A response can never fail to encode: a lone surrogate stored before details were checked
is sent as a JSON escape."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

from opstate.api import create_app
from opstate.config import Settings
from opstate.domain.model import OpRecord
from opstate.domain.states import State
from opstate.domain.strict_json import dumps
from opstate.local.apigw import response_parts
from opstate.signatures import StaticSecretsVerifier
from opstate.store.sqlite import SQLiteStore
from tests.support.webhooks import TEST_SECRET, operation_event


def test_dumps_is_always_utf8_encodable() -> None:
    text = dumps({"note": "a\ud800b", "ok": "é"})
    text.encode("utf-8")
    assert json.loads(text) == {"note": "a\ud800b", "ok": "é"}
    assert dumps({"ok": "é"}) == '{"ok": "é"}'  # non-ASCII stays as is when it can


def test_get_of_an_old_row_holding_a_lone_surrogate(tmp_path: Path) -> None:
    db = tmp_path / "old.db"
    store = SQLiteStore(db)
    try:
        store.put_if_absent(OpRecord("batches/s", State.RUNNING, 1, 1, "report"))
        with sqlite3.connect(db) as conn:
            conn.execute(
                "UPDATE operations SET details = ? WHERE name = ?",
                (json.dumps({"note": "\udc80"}), "batches/s"),
            )
        app = create_app(
            store=store, verifier=StaticSecretsVerifier((TEST_SECRET,)), settings=Settings()
        )
        result = app.resolve(operation_event("GET", "batches/s"), None)
        status, _, body = response_parts(result)
        assert status == 200
        assert json.loads(body.decode("utf-8"))["details"] == {"note": "\udc80"}
    finally:
        store.close()
