"""A read command never invents a store (issue 49): on a SQLite store that is not there,
``list``, ``get``, ``results``, ``wait``, ``refresh`` and ``retry --stop`` say ``no store at
...`` (the file's absolute path when the URL is relative), exit 1 and create nothing, neither the
file nor its folders; the passes ``retry --once`` and ``archive --once`` say it and exit 0 with
nothing done; ``track`` creates it as before. A
DynamoDB table that is not there is named as such, not "unavailable, try again later". And
``AWS_REGION`` alone is a region for the CLI (boto3 reads only ``AWS_DEFAULT_REGION``)."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import boto3
import pytest

from tests.support.cli import Result, in_process
from tests.support.stores import unique_table
from tests.support.template import create_table_from_template

READERS: tuple[tuple[str, ...], ...] = (
    ("list",),
    ("list", "--json"),
    ("get", "batches/a"),
    ("results", "batches/a"),
    ("wait", "batches/a", "--timeout", "0"),
    ("refresh", "batches/a"),
    ("retry", "--stop", "batches/a"),
)
# A periodic pass has nothing to do on a store that is not there: it says so, exits 0 (as on an
# empty store) and creates nothing either.
PASSES: tuple[tuple[str, ...], ...] = (("retry", "--once"), ("archive", "--once"))


@pytest.fixture
def run(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> Callable[..., Result]:
    for key in ("OPSTATE_STORE", "OPSTATE_TABLE_NAME"):
        monkeypatch.delenv(key, raising=False)
    # refresh needs a key before it looks at the store; nothing here reaches Gemini
    monkeypatch.setenv("GEMINI_API_KEY", "test-key")
    monkeypatch.setenv("GOOGLE_GEMINI_BASE_URL", "http://127.0.0.1:9")
    return in_process(monkeypatch, capsys)


def _tree(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


@pytest.mark.parametrize("argv", READERS, ids=lambda a: "-".join(a))
def test_a_read_on_a_missing_sqlite_store_says_so_and_creates_nothing(
    run: Callable[..., Result], tmp_path: Path, argv: tuple[str, ...]
) -> None:
    where = tmp_path / "nonexistent" / "dir" / "ops.db"
    code, out, err = run(*argv, "--store", f"sqlite:///{where}")
    assert code == 1, err
    assert f"opstate: error: no store at sqlite:///{where} (chosen by --store)" in err
    assert "--store or OPSTATE_STORE" in err and "Traceback" not in err
    assert out == ""
    assert _tree(tmp_path) == []  # no file, no folders


@pytest.mark.parametrize("argv", PASSES, ids=lambda a: "-".join(a))
def test_a_pass_on_a_missing_sqlite_store_says_so_does_nothing_and_creates_nothing(
    run: Callable[..., Result], tmp_path: Path, argv: tuple[str, ...]
) -> None:
    where = tmp_path / "nonexistent" / "ops.db"
    result = run(*argv, "--store", f"sqlite:///{where}")
    assert result.code == 0, result.err
    assert result.err == (
        f"opstate: no store at sqlite:///{where} (chosen by --store): nothing has been tracked "
        "there; nothing to do\n"
    )
    assert not any(result.json().values())  # every count 0
    assert _tree(tmp_path) == []


def test_the_default_store_is_named_by_its_absolute_path_and_track_creates_it(
    run: Callable[..., Result], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    code, _, err = run("list")
    assert code == 1
    where = tmp_path / ".opstate" / "ops.db"
    assert f"no store at sqlite:///.opstate/ops.db ({where}) (chosen by the default)" in err
    assert not (tmp_path / ".opstate").exists()

    assert run("track", "batches/a").code == 0  # an acting command creates it, as before
    assert where.is_file()
    code, out, _ = run("list")
    assert code == 0 and "batches/a" in out


def test_a_dangling_link_is_not_a_store_either(run: Callable[..., Result], tmp_path: Path) -> None:
    link = tmp_path / "ops.db"
    link.symlink_to(tmp_path / "elsewhere.db")
    code, _, err = run("list", "--store", f"sqlite:///{link}")
    # a link is the local user's (THREATS e): never followed to create its target
    assert code == 1 and "ops.db" in err
    assert not (tmp_path / "elsewhere.db").exists()


@pytest.fixture
def moto_dynamodb(moto_server: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.setenv("AWS_ENDPOINT_URL_DYNAMODB", moto_server.endpoint)
    return moto_server


@pytest.mark.parametrize("argv", [("list",), ("get", "batches/a"), ("track", "batches/a")])
def test_a_missing_dynamodb_table_is_named_not_unavailable(
    run: Callable[..., Result], moto_dynamodb: Any, argv: tuple[str, ...]
) -> None:
    table = unique_table()
    code, _, err = run(*argv, "--store", f"dynamodb://{table}")
    assert code == 1, err
    assert f"no store at dynamodb://{table}" in err
    assert "does not exist in the region us-east-1" in err
    assert "try again later" not in err


def test_aws_region_alone_is_the_region(
    run: Callable[..., Result], moto_dynamodb: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    table = unique_table()
    client = boto3.client("dynamodb", endpoint_url=moto_dynamodb.endpoint, region_name="eu-west-1")
    create_table_from_template(client, table)
    monkeypatch.delenv("AWS_DEFAULT_REGION")
    monkeypatch.setenv("AWS_REGION", "eu-west-1")
    code, out, err = run("list", "--store", f"dynamodb://{table}")
    assert (code, out.strip()) == (0, "no operations"), err
    assert "AWS_DEFAULT_REGION" not in os.environ  # restored after the command


def test_no_region_names_the_variable_boto3_reads(
    run: Callable[..., Result], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv("AWS_DEFAULT_REGION")
    monkeypatch.delenv("AWS_REGION")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    code, _, err = run("list", "--store", "dynamodb://ops")
    assert code == 2
    assert "set AWS_DEFAULT_REGION (boto3's variable; opstate also reads AWS_REGION)" in err
