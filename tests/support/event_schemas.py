"""The JSON Schemas of the bus events' ``detail`` (``schemas/<kebab detail-type>.schema.json``)
and the check every notifier integration test applies to every event it receives."""

from __future__ import annotations

import functools
import json
import re
from pathlib import Path
from typing import Any

from jsonschema import Draft202012Validator

ROOT = Path(__file__).resolve().parents[2]
SCHEMAS = ROOT / "schemas"


def schema_file(detail_type: str) -> Path:
    """``Operation State Changed`` -> ``schemas/operation-state-changed.schema.json``."""
    kebab = re.sub(r"[^a-z0-9]+", "-", detail_type.lower()).strip("-")
    return SCHEMAS / f"{kebab}.schema.json"


@functools.lru_cache(maxsize=16)
def validator(detail_type: str) -> Draft202012Validator:
    schema = json.loads(schema_file(detail_type).read_text(encoding="utf-8"))
    Draft202012Validator.check_schema(schema)
    return Draft202012Validator(schema)


def problems(detail_type: str, detail: Any) -> list[str]:
    return [
        f"{'/'.join(map(str, e.absolute_path)) or '<detail>'}: {e.message}"
        for e in validator(detail_type).iter_errors(detail)
    ]


def check_envelope(envelope: dict[str, Any]) -> None:
    """Fail (AssertionError) unless ``envelope['detail']`` validates against the schema of
    its ``detail-type``."""
    detail_type = envelope["detail-type"]
    found = problems(detail_type, envelope["detail"])
    assert not found, f"{detail_type} does not match {schema_file(detail_type).name}: {found}"
