"""The acting rooms are typed against their ports (issue 49): no store or client parameter (or
attribute) annotated with ``Any`` in the rooms below, so a reader sees what a pass may call and
mypy checks it. A store is a ``store.port`` protocol (``RetryingStore``, ``RetryPassStore``...),
a Gemini client ``opstate.gemini.port.GeminiClient``, a boto3 client its ``mypy_boto3_*`` type.

Issue 49 counted 42 such annotations in these four rooms; to check another room (the job
queue's, issue 46), add its package to ``TYPED_ROOMS``.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "layers" / "opstate" / "opstate"

# The rooms whose store and client parameters must name their port (package folders).
TYPED_ROOMS = ("retry", "gemini", "wiring", "outcomes")

# A store or client: ``store``, ``client``, ``used_store``, ``s3_client``, ``_client``...
_PORT_NAME = re.compile(r"(^|_)(store|client)$")


def _mentions_any(annotation: ast.expr | None) -> bool:
    return annotation is not None and any(
        (isinstance(node, ast.Name) and node.id == "Any")
        or (isinstance(node, ast.Attribute) and node.attr == "Any")
        for node in ast.walk(annotation)
    )


def any_ports(source: str) -> list[tuple[int, str]]:
    """(line, name) of every store/client parameter, attribute or variable annotated with a
    type that mentions ``Any`` (``Any``, ``Any | None``, ``typing.Any``)."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            a = node.args
            extra = [x for x in (a.vararg, a.kwarg) if x is not None]
            for arg in [*a.posonlyargs, *a.args, *a.kwonlyargs, *extra]:
                if _PORT_NAME.search(arg.arg) and _mentions_any(arg.annotation):
                    found.append((arg.lineno, arg.arg))
        elif isinstance(node, ast.AnnAssign):
            target = node.target
            name = (
                target.id
                if isinstance(target, ast.Name)
                else target.attr
                if isinstance(target, ast.Attribute)
                else ""
            )
            if _PORT_NAME.search(name) and _mentions_any(node.annotation):
                found.append((node.lineno, name))
    return sorted(found)


def room_files(room: str) -> list[Path]:
    return sorted((PACKAGE / room).rglob("*.py"))


@pytest.mark.parametrize("room", TYPED_ROOMS)
def test_no_store_or_client_is_typed_any(room: str) -> None:
    files = room_files(room)
    assert files, f"no module under opstate/{room}: update TYPED_ROOMS"
    found = [
        f"{path.relative_to(PACKAGE)}:{line}: {name}"
        for path in files
        for line, name in any_ports(path.read_text(encoding="utf-8"))
    ]
    assert found == [], (
        "type these against their port (store.port's protocols, gemini.port.GeminiClient, "
        f"a mypy_boto3 client), not Any: {found}"
    )


def test_the_check_finds_every_form() -> None:
    source = """
from typing import Any
import typing

class Runner:
    store: Any
    client: "int"

    def __init__(self, store: Any, s3_client: typing.Any = None) -> None:
        self.client: Any | None = None
        self.sink: Any = None

def one(store: Any | None, /, sink: Any, *, gemini_client: Any, clock: Any) -> None: ...
async def two(storey: Any, restore: Any, _client: dict[str, Any]) -> None: ...
def three(store: RetryingStore, client: GeminiClient, used_store=None) -> None: ...
"""
    assert any_ports(source) == [
        (6, "store"),
        (9, "s3_client"),
        (9, "store"),
        (10, "client"),
        (13, "gemini_client"),
        (13, "store"),
        (14, "_client"),
    ]


def test_the_rooms_exist() -> None:
    # A room renamed or moved would otherwise pass unchecked.
    for room in TYPED_ROOMS:
        assert (PACKAGE / room / "__init__.py").is_file(), room
