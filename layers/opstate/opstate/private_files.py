"""The one rule for local files that hold secrets or state: nobody else may read, write or swap
them.

A secret file (the API token file, the webhook secret file) is read only when it is a regular
file opened without following a symlink (``O_NOFOLLOW``), owned by the current user, and
neither readable nor writable by group or others; otherwise ``UnsafeFileError`` says, in one
sentence, which file and how to fix it (``opstate serve`` refuses to start with it). What the
content must hold (a token at least as long as ``OPSTATE_API_TOKEN`` must be, a ``whsec_`` key)
is the caller's rule, checked on what this module read.

Files and folders this system creates locally are private from the start: folders 0700
(``.opstate/``), files 0600 (the secret files, the SQLite store and its quarantine); SQLite
gives its ``-wal`` and ``-shm`` files the database file's mode. A folder a user names to write
into (``opstate results --download DEST``) is opened once (``open_private_dir``: not a link,
the user's own, writable by nobody else) and written relative to that descriptor.

Imports nothing of opstate: every layer may use it.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import stat
from pathlib import Path

PRIVATE_FILE_MODE = 0o600
PRIVATE_DIR_MODE = 0o700
# Bigger than any secret file this system writes; a larger file is not read whole.
MAX_SECRET_FILE_BYTES = 64 * 1024


class UnsafeFileError(ValueError):
    """A secret file others could read, write or swap; the message names it and the fix."""


def _check(path: Path, st: os.stat_result, what: str) -> None:
    if not stat.S_ISREG(st.st_mode):
        raise UnsafeFileError(f"{what} {path} is not a regular file; replace it with one")
    if st.st_uid != os.geteuid():
        raise UnsafeFileError(
            f"{what} {path} is owned by uid {st.st_uid}, not by you (uid {os.geteuid()}); "
            "delete it and let it be written again, or chown it to yourself"
        )
    if st.st_mode & 0o077:
        raise UnsafeFileError(
            f"{what} {path} has mode {stat.S_IMODE(st.st_mode):04o}, which lets other users "
            f"read or change it; fix it with: chmod 600 {path}"
        )


def read_private_file(path: Path, what: str) -> bytes:
    """The bytes of the secret file ``path`` if it follows the module's rule.

    ``what`` names the file in the message ("the API token file"). ``FileNotFoundError`` when
    it does not exist, ``UnsafeFileError`` when it breaks the rule (a symlink included), other
    ``OSError`` when it cannot be read.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        if _is_symlink_refusal(path, exc):
            raise UnsafeFileError(
                f"{what} {path} is a symbolic link, which someone could point at a file "
                f"they control; replace it with the file itself (e.g. cp --remove-destination "
                f'"$(readlink -f {path})" {path})'
            ) from None
        raise
    with os.fdopen(fd, "rb") as fh:
        _check(path, os.fstat(fh.fileno()), what)
        data = fh.read(MAX_SECRET_FILE_BYTES + 1)
    if len(data) > MAX_SECRET_FILE_BYTES:
        raise UnsafeFileError(
            f"{what} {path} is larger than {MAX_SECRET_FILE_BYTES} bytes; it is not a secret "
            "file this system wrote"
        )
    return data


def _is_symlink_refusal(path: Path, exc: OSError) -> bool:
    """Whether ``os.open(..., O_NOFOLLOW)`` failed because ``path`` is a symlink (ELOOP)."""
    import errno

    return exc.errno == errno.ELOOP or (exc.errno == errno.EMLINK and path.is_symlink())


def make_private_dir(path: Path) -> None:
    """Create ``path`` (and missing parents) with mode 0700; an existing folder is left as
    it is (it may be the user's own)."""
    if path.is_dir():
        return
    with contextlib.suppress(FileExistsError):
        path.mkdir(mode=PRIVATE_DIR_MODE, parents=True)


def open_private_dir(path: Path, what: str) -> int:
    """A descriptor of the folder ``path`` to write into (created 0700 when missing): a folder
    itself (never a symbolic link), owned by the current user and writable by nobody else;
    otherwise ``UnsafeFileError`` saying which folder and how to fix it. Everything written
    into it goes relative to the descriptor, so the folder checked is the folder written."""
    make_private_dir(path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        if _is_symlink_refusal(path, exc) or path.is_symlink():
            raise UnsafeFileError(
                f"{what} {path} is a symbolic link, which someone could point elsewhere; "
                "name the folder itself"
            ) from None
        raise
    try:
        st = os.fstat(fd)
        if st.st_uid != os.geteuid():
            raise UnsafeFileError(
                f"{what} {path} is owned by uid {st.st_uid}, not by you (uid {os.geteuid()}); "
                "name a folder of your own"
            )
        if st.st_mode & 0o022:
            raise UnsafeFileError(
                f"{what} {path} has mode {stat.S_IMODE(st.st_mode):04o}: it is writable by "
                "other users, who could plant links among the files written there; name a "
                f"folder only you can write (chmod go-w {path})"
            )
    except BaseException:
        os.close(fd)
        raise
    return fd


_CREATE_NEW = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


def create_database_file(path: Path) -> None:
    """Create ``path`` empty with mode 0600 when nothing is there (not even a symlink), so the
    SQLite database created in it next is private from its first byte; never opens ``path``.

    SQLite's locks are POSIX advisory locks, which a process loses on every descriptor of a
    file as soon as it closes any descriptor of it. Opening and closing the database file here
    while a connection of this process holds it (the store, then the quarantine or the waiters
    on the same file) would drop that connection's locks: another process's closing connection
    then believes it is the last one, checkpoints and deletes the ``-wal`` and ``-shm`` under
    the living ones, and acknowledged writes are lost (issue 30). So the file is made under a
    unique temporary name, closed, and only then hard-linked to ``path`` (which fails, leaving
    it alone, if ``path`` appeared meanwhile); no descriptor of this process ever refers to
    the inode while it has that name. Where hard links are not supported, ``O_EXCL`` creates
    ``path`` itself, a new inode (only a connection another thread of this process opened in
    the instant between that create and its close could be hurt). Failures are left to the
    database open that follows (it says why: a symlink's target, a folder not writable).
    """
    make_private_dir(path.parent)
    if os.path.lexists(path):
        return
    temp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(8)}.new")
    try:
        fd = os.open(temp, _CREATE_NEW, PRIVATE_FILE_MODE)
    except OSError:
        return
    os.close(fd)
    try:
        os.link(temp, path)
    except FileExistsError:
        pass  # another process created it first: theirs is the database
    except OSError:
        _create_in_place(path)  # no hard links on this file system
    finally:
        with contextlib.suppress(OSError):
            os.unlink(temp)


def _create_in_place(path: Path) -> None:
    try:
        fd = os.open(path, _CREATE_NEW, PRIVATE_FILE_MODE)
    except OSError:
        return  # it exists now, or cannot be created: left to SQLite
    os.close(fd)
