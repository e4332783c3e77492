"""What a release is made of (issue 42): the license pyproject declares, one version read by
everything that names one, and a changelog whose newest release is that version."""

from __future__ import annotations

import hashlib
import re
import tomllib
from pathlib import Path

import pytest

import opstate
from opstate.cli.app import main

ROOT = Path(__file__).resolve().parents[2]
# sha256 of https://www.apache.org/licenses/LICENSE-2.0.txt, the Apache Software Foundation's
# canonical text (11,358 bytes; byte-identical to the LICENSE google-genai 3.6.1 ships, from
# which LICENSE was copied).
APACHE_2_0_SHA256 = "cfc7749b96f63bd31c3c42b5c471bf756814053e847c10f3eb003417bc523d30"
RELEASE = re.compile(r"^## \[(\d+\.\d+\.\d+)\] - (\d{4}-\d{2}-\d{2}|unreleased)$", re.M)


def project() -> dict[str, object]:
    data = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    found: dict[str, object] = data["project"]
    return found


def test_license_is_the_canonical_apache_2_0_text_pyproject_declares() -> None:
    body = (ROOT / "LICENSE").read_bytes()
    assert hashlib.sha256(body).hexdigest() == APACHE_2_0_SHA256
    assert project()["license"] == "Apache-2.0"
    assert project()["license-files"] == ["LICENSE"]


def test_one_place_defines_the_version() -> None:
    assert "version" not in project() and project()["dynamic"] == ["version"]
    data = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    assert data["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "opstate.__version__"}
    assert re.fullmatch(r"\d+\.\d+\.\d+", opstate.__version__)


def test_opstate_version_prints_it(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--version"]) == 0
    assert capsys.readouterr().out == f"opstate {opstate.__version__}\n"


def changelog() -> str:
    return (ROOT / "CHANGELOG.md").read_text(encoding="utf-8")


def test_the_changelog_s_newest_release_is_this_version() -> None:
    releases = RELEASE.findall(changelog())
    assert releases, "no '## [X.Y.Z] - DATE' heading"
    assert releases[0][0] == opstate.__version__
    versions = [tuple(int(n) for n in v.split(".")) for v, _ in releases]
    assert versions == sorted(versions, reverse=True) and len(set(versions)) == len(versions)


def test_every_release_says_what_it_did_to_stored_data_and_what_an_upgrade_needs() -> None:
    body = changelog()
    sections = RELEASE.split(body)[1:]
    # split gives (version, date, text) triples
    for version, _date, text in zip(sections[0::3], sections[1::3], sections[2::3], strict=True):
        assert "### Stored data" in text, version
        assert "### Upgrading" in text, version
