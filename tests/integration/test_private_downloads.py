"""Private downloads (issue 47): ``opstate results NAME --download DEST`` writes as the results
folder does (THREATS.md, "Files opstate writes locally"): files 0600 created
``O_CREAT|O_EXCL|O_NOFOLLOW`` relative to DEST's descriptor, a DEST created 0700; a DEST not
owned by the user or writable by others is refused before anything is written; a link
planted where the previous release put its temporary file (``DEST/.<name>.part``) or at a
file's own name is never written through. The local user (actor e) is the attacker.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

import pytest

from tests.integration.test_outcomes_hostile import cli  # noqa: F401 - the fixture
from tests.support.fake_gemini import FakeGemini
from tests.support.outcomes import batch_output, now_text

NAME = "batches/dl"


def archived(cli: Any, fake: FakeGemini) -> bytes:  # noqa: F811
    """Batch ``NAME`` tracked, refreshed and archived into the results folder; its output."""
    data, _ = batch_output(3, {})
    file = fake.put_file("dl", body=data, expiration_time=now_text(86400))
    fake.put_batch(NAME, "SUCCEEDED", update_time=now_text(-60), responses_file=file)
    for argv in (("track", NAME), ("reconcile", "--once"), ("archive", "--once")):
        code, _, err = cli(*argv)
        assert code == 0, err
    return data


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


def test_a_download_is_private_and_a_new_dest_is_0700(
    cli: Any,  # noqa: F811
    fake_gemini: FakeGemini,
    tmp_path: Path,
) -> None:
    data = archived(cli, fake_gemini)
    dest = tmp_path / "copy"
    code, _, err = cli("results", NAME, "--download", str(dest))
    assert code == 0, err
    assert (dest / "output.jsonl").read_bytes() == data
    assert _mode(dest) == 0o700
    assert sorted(p.name for p in dest.iterdir()) == ["output.jsonl", "summary.json"]
    assert {p.name: _mode(p) for p in dest.iterdir()} == {
        "output.jsonl": 0o600,
        "summary.json": 0o600,
    }


@pytest.mark.parametrize("planted", [".output.jsonl.part", "output.jsonl"])
def test_a_link_planted_in_dest_is_never_written_through(
    cli: Any,  # noqa: F811
    fake_gemini: FakeGemini,
    tmp_path: Path,
    planted: str,
) -> None:
    data = archived(cli, fake_gemini)
    dest = tmp_path / "copy"
    dest.mkdir(mode=0o700)
    victim = tmp_path / "victim.txt"
    victim.write_bytes(b"the user's own file")
    (dest / planted).symlink_to(victim)
    code, _, err = cli("results", NAME, "--download", str(dest))
    assert code == 0, err
    assert victim.read_bytes() == b"the user's own file"
    copied = dest / "output.jsonl"
    assert not copied.is_symlink() and copied.read_bytes() == data and _mode(copied) == 0o600


def test_a_dest_writable_by_others_is_refused_before_anything_is_written(
    cli: Any,  # noqa: F811
    fake_gemini: FakeGemini,
    tmp_path: Path,
) -> None:
    archived(cli, fake_gemini)
    dest = tmp_path / "shared"
    dest.mkdir()
    dest.chmod(0o777)
    code, _, err = cli("results", NAME, "--download", str(dest))
    assert code != 0 and "writable by other users" in err and str(dest) in err, err
    assert list(dest.iterdir()) == []


def test_a_dest_owned_by_someone_else_is_refused(
    cli: Any,  # noqa: F811
    fake_gemini: FakeGemini,
    tmp_path: Path,
) -> None:
    archived(cli, fake_gemini)
    if os.geteuid() == 0:
        dest = tmp_path / "theirs"
        dest.mkdir(mode=0o700)
        os.chown(dest, 65534, -1)
    else:
        dest = Path("/")  # root's
    code, _, err = cli("results", NAME, "--download", str(dest))
    assert code != 0 and "not by you" in err and str(dest) in err, err
    if dest != Path("/"):
        assert list(dest.iterdir()) == []


def test_a_dest_that_is_a_link_is_refused(
    cli: Any,  # noqa: F811
    fake_gemini: FakeGemini,
    tmp_path: Path,
) -> None:
    archived(cli, fake_gemini)
    target = tmp_path / "elsewhere"
    target.mkdir(mode=0o700)
    dest = tmp_path / "copy"
    dest.symlink_to(target)
    code, _, err = cli("results", NAME, "--download", str(dest))
    assert code != 0 and "symbolic link" in err, err
    assert list(target.iterdir()) == []
