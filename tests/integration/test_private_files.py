"""Issue 24 section 2: local files that cannot be swapped or read by others.

One rule for every secret file (the API token file, the webhook secret file): as long as the
variable must be, owned by the current user, not readable or writable by group or others, not
a symlink; otherwise ``opstate serve`` refuses to start with one sentence naming the file and
the fix. ``.opstate/`` is created 0700, the SQLite store and its quarantine 0600 — without
ever opening a database file that exists (issue 30: that drops the process's SQLite locks).
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from opstate.api_token import resolve_api_token
from opstate.config import Settings
from opstate.local.secret_file import resolve_secrets
from opstate.private_files import UnsafeFileError, create_database_file, read_private_file
from opstate.quarantine import local_quarantine
from opstate.store import store_from_url
from opstate.webhook_secrets import SecretFileReader, generate_secret, read_secret_file
from tests.support.serve_process import run_cli, start_serve

TOKEN = "t" * 43


def private(path: Path, text: str, mode: int = 0o600) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(mode)
    return path


def mode_of(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


@pytest.fixture
def umask_022() -> Iterator[None]:
    """The usual umask (files 0644 unless made private), restored after the test."""
    before = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(before)


def test_a_token_file_shorter_than_the_variable_allows_is_refused(tmp_path: Path) -> None:
    path = private(tmp_path / "api-token", "a\n")
    with pytest.raises(ValueError, match=r"api-token does not hold one token of at least 32"):
        resolve_api_token(None, path)
    private(path, "x" * 31 + "\n")
    with pytest.raises(ValueError, match="at least 32"):
        resolve_api_token(None, path)
    private(path, TOKEN + "\n")
    assert resolve_api_token(None, path).token == TOKEN


@pytest.mark.parametrize("mode", [0o666, 0o644, 0o640, 0o620, 0o602])
def test_secret_files_others_could_read_or_write_are_refused(tmp_path: Path, mode: int) -> None:
    token = private(tmp_path / "api-token", TOKEN, mode)
    with pytest.raises(ValueError, match=rf"api-token has mode {mode:04o}.*chmod 600 {token}"):
        resolve_api_token(None, token)
    secret = private(tmp_path / "webhook-secret", generate_secret() + "\n", mode)
    with pytest.raises(UnsafeFileError, match="chmod 600"):
        read_secret_file(secret)
    with pytest.raises(ValueError, match=r"the webhook secret file .* has mode"):
        resolve_secrets(Settings(), secret)


def test_a_secret_file_that_is_a_symlink_is_refused(tmp_path: Path) -> None:
    planted = private(tmp_path / "elsewhere" / "planted", TOKEN)  # private, but not the file
    link = tmp_path / ".opstate" / "api-token"
    link.parent.mkdir()
    link.symlink_to(planted)
    with pytest.raises(ValueError, match="api-token is a symbolic link"):
        resolve_api_token(None, link)
    secret_link = tmp_path / ".opstate" / "webhook-secret"
    secret_link.symlink_to(private(tmp_path / "elsewhere" / "key", generate_secret()))
    with pytest.raises(ValueError, match="webhook-secret is a symbolic link"):
        resolve_secrets(Settings(), secret_link)
    # A dangling link is not replaced by a generated file either: it is refused the same way.
    dangling = tmp_path / "d" / "api-token"
    dangling.parent.mkdir()
    dangling.symlink_to(tmp_path / "nowhere")
    with pytest.raises(ValueError, match="symbolic link"):
        resolve_api_token(None, dangling)


def test_a_secret_file_owned_by_someone_else_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = private(tmp_path / "api-token", TOKEN)
    me = os.geteuid()
    monkeypatch.setattr("opstate.private_files.os.geteuid", lambda: me + 1)
    with pytest.raises(UnsafeFileError, match=rf"owned by uid {me}, not by you"):
        read_private_file(path, "the API token file")


def test_a_secret_file_swapped_while_serving_is_not_trusted(tmp_path: Path) -> None:
    first, planted_key = generate_secret(), generate_secret()
    path = private(tmp_path / "webhook-secret", first + "\n")
    reader = SecretFileReader(path)
    assert first.encode() in reader()
    planted = private(tmp_path / "planted", planted_key + "\n")
    path.unlink()
    path.symlink_to(planted)
    assert planted_key.encode() not in reader()  # the last trusted content stays in use
    assert first.encode() in reader()
    path.unlink()
    private(path, planted_key + "\n", 0o666)
    assert first.encode() in reader()


def test_serve_refuses_to_start_with_one_sentence_naming_the_file(tmp_path: Path) -> None:
    token = private(tmp_path / ".opstate" / "api-token", TOKEN, 0o644)
    result = run_cli(
        ["serve", "--store", "memory://", "--port", "0"],
        cwd=tmp_path,
        env={"OPSTATE_API_TOKEN": None, "OPSTATE_WEBHOOK_SECRETS": generate_secret()},
    )
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert str(token) in lines[0] and "chmod 600" in lines[0]
    token.chmod(0o600)
    private(token, "a\n")
    result = run_cli(
        ["serve", "--store", "memory://", "--port", "0"],
        cwd=tmp_path,
        env={"OPSTATE_API_TOKEN": None, "OPSTATE_WEBHOOK_SECRETS": generate_secret()},
    )
    assert result.returncode == 1 and "at least 32" in result.stderr


def test_opstate_folder_store_and_quarantine_are_private(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, umask_022: None
) -> None:
    monkeypatch.chdir(tmp_path)
    store = store_from_url("sqlite:///.opstate/ops.db")
    try:
        quarantine = local_quarantine("sqlite:///.opstate/ops.db")
        assert quarantine.count() == 0
        assert mode_of(tmp_path / ".opstate") == 0o700
        assert mode_of(tmp_path / ".opstate" / "ops.db") == 0o600
        other = local_quarantine("dynamodb://table")  # its own file: .opstate/quarantine.db
        assert other.count() == 0
        assert mode_of(tmp_path / ".opstate" / "quarantine.db") == 0o600
        assert store.get("batches/x") is None
        for side in (tmp_path / ".opstate").glob("ops.db-*"):  # -wal, -shm
            assert mode_of(side) == 0o600, side
    finally:
        store.close()


def test_serve_creates_its_folder_and_files_private(tmp_path: Path) -> None:
    server = start_serve([], cwd=tmp_path, env={"OPSTATE_API_TOKEN": None})
    try:
        folder = tmp_path / ".opstate"
        assert mode_of(folder) == 0o700
        for name in ("ops.db", "webhook-secret", "api-token"):
            assert mode_of(folder / name) == 0o600, name
        assert server.terminate() == 0
    finally:
        server.kill()


def test_opstate_webhooks_refuses_an_unsafe_secret_file_too(tmp_path: Path) -> None:
    from opstate.cli.common import CliError
    from opstate.cli.webhook_secrets import FileSecretTarget

    path = private(tmp_path / "webhook-secret", generate_secret() + "\n", 0o664)
    target = FileSecretTarget(path)
    with pytest.raises(CliError, match="chmod 600"):
        target.read()
    with pytest.raises(CliError, match="chmod 600"):
        target.update(lambda keys: [generate_secret(), *keys])
    assert mode_of(path) == 0o664  # nothing written


def test_a_new_database_file_is_private_and_nothing_else_is_left(
    tmp_path: Path, umask_022: None
) -> None:
    path = tmp_path / "new" / "ops.db"
    create_database_file(path)
    assert mode_of(path.parent) == 0o700 and mode_of(path) == 0o600
    assert path.stat().st_size == 0 and path.stat().st_nlink == 1
    assert os.listdir(path.parent) == ["ops.db"]  # the temporary name is gone


def test_an_existing_database_file_or_symlink_is_left_as_it_is(tmp_path: Path) -> None:
    mine = private(tmp_path / "mine.db", "SQLite format 3\x00", 0o644)
    create_database_file(mine)
    assert (mode_of(mine), mine.read_text()) == (0o644, "SQLite format 3\x00")
    link = tmp_path / "link.db"
    link.symlink_to(tmp_path / "elsewhere.db")
    create_database_file(link)
    assert link.is_symlink() and not (tmp_path / "elsewhere.db").exists()
    assert sorted(os.listdir(tmp_path)) == ["link.db", "mine.db"]


_TRY_LOCK = textwrap.dedent(
    """
    import fcntl, os, sys
    fd = os.open(sys.argv[1], os.O_RDWR)
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, 0)
    except OSError:
        print("held")
    else:
        print("free")
    """
)


def test_a_database_file_this_process_holds_keeps_its_locks(tmp_path: Path) -> None:
    """A POSIX lock (SQLite's kind) is dropped when the process closes any descriptor of the
    file: creating the file must not open it when it exists (issue 30)."""
    import fcntl

    path = tmp_path / "ops.db"
    create_database_file(path)
    fd = os.open(path, os.O_RDWR)
    try:
        fcntl.lockf(fd, fcntl.LOCK_SH, 1, 0)
        create_database_file(path)  # the store, then the quarantine and the waiters on it
        other = subprocess.run(
            [sys.executable, "-c", _TRY_LOCK, str(path)],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        )
        assert other.stdout.strip() == "held"
    finally:
        os.close(fd)
