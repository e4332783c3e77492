"""README.md's "Use it without a clone" says what each extra of the package adds (issue 42):
its table names exactly pyproject's extras and their packages, and a command that needs an extra
the install lacks says which one in a sentence instead of a traceback."""

from __future__ import annotations

import re
import sys
import tomllib
from pathlib import Path

import pytest

from opstate.cli.app import main
from opstate.config import ConfigError, settings
from opstate.gemini.client import make_client

ROOT = Path(__file__).resolve().parents[2]
SECTION = "## Use it without a clone"
GEMINI_HINT = "install it with pip install 'gemini-opstate[gemini]'"


def requirement_names(requirements: list[str]) -> set[str]:
    return {re.split(r"[\[<>=!~; ]", r, maxsplit=1)[0].lower() for r in requirements}


def extras_table() -> dict[str, set[str]]:
    """{extra ('' for none): the package names its 'adds' cell quotes}."""
    body = (ROOT / "README.md").read_text(encoding="utf-8")
    section = body.split(SECTION, 1)[1].split("\n## ", 1)[0]
    rows: dict[str, set[str]] = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 3 or cells[0] in ("extra", "---"):
            continue
        extra = "" if cells[0] == "(none)" else cells[0].strip("`")
        rows[extra] = {name.lower() for name in re.findall(r"`([A-Za-z0-9_.-]+)`", cells[1])}
    return rows


def test_the_table_names_every_extra_and_what_each_installs() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    extras: dict[str, list[str]] = project["optional-dependencies"]
    table = extras_table()
    assert set(table) == {"", *extras}
    assert table[""] == requirement_names(project["dependencies"])
    for extra, requirements in extras.items():
        if extra == "dev":  # the toolchain: the row names some of it, all of them real
            assert table[extra] and table[extra] <= requirement_names(requirements)
        else:
            assert table[extra] == requirement_names(requirements), extra


def test_without_google_genai_a_gemini_command_says_which_extra_to_install(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    monkeypatch.setitem(sys.modules, "google", None)  # import google... raises ImportError
    monkeypatch.setenv("GEMINI_API_KEY", "test-key")
    for key in ("OPSTATE_STORE", "OPSTATE_TABLE_NAME"):
        monkeypatch.delenv(key, raising=False)
    settings.cache_clear()
    try:
        with pytest.raises(ConfigError, match=re.escape(GEMINI_HINT)):
            make_client(settings())
        store = f"sqlite:///{tmp_path / 'ops.db'}"
        assert main(["track", "batches/x", "--store", store]) == 0
        capsys.readouterr()
        assert main(["refresh", "batches/x", "--store", store]) == 2
        said = capsys.readouterr().err
        assert GEMINI_HINT in said and "Traceback" not in said
    finally:
        settings.cache_clear()
    body = (ROOT / "README.md").read_text(encoding="utf-8")
    assert f"`{GEMINI_HINT}`" in body.split(SECTION, 1)[1]
