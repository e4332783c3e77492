"""Guards for a system that acts (issue 38, the engine's half): opstate creates or cancels at
Gemini only on Gemini's own word about a job it read right before acting, only on batches it
created, with child ids nobody can guess, from input bytes it verified, within a budget; and
what it keeps in a local results folder is private and never written through a link.

Each test is one of the issue's reproductions, tried as an attacker would with the project's
own fakes (the fake Gemini, the results folder, the embedded SQLite store, ``retry_once``
in-process); each fails on the release before the guard.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from opstate.outcomes import file_sink as file_sink_module
from opstate.outcomes.file_sink import FileSink


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


# -- repro 8: a local results folder is private and never written through a link ------------


def test_the_folder_sink_writes_private_folders_and_files(tmp_path: Path) -> None:
    root = tmp_path / "results"
    sink = FileSink(root)
    before = os.umask(0o022)  # the usual umask: what the sink creates must not rely on it
    try:
        with sink.open("inputs/abc/input.jsonl", name="x") as out:
            out.write(b'{"key": "a", "request": {}}\n')
            out.commit("")
    finally:
        os.umask(before)
    assert _mode(root) == 0o700
    assert _mode(root / "inputs") == 0o700 and _mode(root / "inputs/abc") == 0o700
    assert _mode(root / "inputs/abc/input.jsonl") == 0o600


def test_a_tree_an_older_release_wrote_0755_0644_is_still_read(tmp_path: Path) -> None:
    root = tmp_path / "results"
    folder = root / "batches/a/1"
    folder.mkdir(parents=True, mode=0o755)
    for part in (root, root / "batches", root / "batches/a", folder):
        part.chmod(0o755)
    (folder / "output.jsonl").write_bytes(b"old\n")
    (folder / "output.jsonl").chmod(0o644)
    sink = FileSink(root)
    stored = sink.head("batches/a/1/output.jsonl")
    assert stored is not None and stored.size == 4
    assert sink.read("batches/a/1/output.jsonl", 100) == b"old\n"
    assert b"".join(sink.chunks(stored.location)) == b"old\n"


def test_a_folder_swapped_for_a_link_after_the_checks_is_not_written_through(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The race of the issue made certain: the folder becomes a link to a folder outside the
    root right after the sink looked at it (as the temporary name is drawn), before the write."""
    root = tmp_path / "results"
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    sink = FileSink(root)
    with sink.open("batches/a/1/summary.json", name="a") as out:  # the folder exists
        out.write(b"{}")
        out.commit("")
    folder = root / "batches/a/1"
    real_uuid4 = file_sink_module.uuid.uuid4

    def swap() -> object:
        if not folder.is_symlink():
            folder.rename(root / "batches/a/moved")
            folder.symlink_to(outside)
        return real_uuid4()

    monkeypatch.setattr(file_sink_module.uuid, "uuid4", swap)
    try:
        with sink.open("batches/a/1/output.jsonl", name="a") as out:
            out.write(b"prompts")
            out.commit("")
    except Exception:  # refusing is fine too; writing outside is not
        pass
    assert list(outside.iterdir()) == []
    # Read by key through the link: no object, never the file outside.
    (outside / "output.jsonl").write_bytes(b"planted")
    assert sink.read("batches/a/1/output.jsonl", 100) is None
    assert sink.head("batches/a/1/output.jsonl") is None
