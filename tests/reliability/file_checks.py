"""The end of a run on a shared SQLite file (issue 30): what the file holds against every
acknowledgement (``sharing.Acks``), its integrity, and whether a living serve ever held a
``-wal`` / ``-shm`` that another process had deleted; and (issue 33) whether any process touched
the store's files other than through SQLite (``audit_env``, ``outside_sqlite``)."""

from __future__ import annotations

import json
import os
import sqlite3
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from opstate.domain.states import RANK, parse_state
from tests.reliability.sharing import Ack, Acks
from tests.support.serve_process import cli_env


@dataclass(frozen=True)
class Row:
    version: int
    state: str
    key: tuple[int, int]


def integrity(db: Path) -> str:
    """``PRAGMA integrity_check``'s answer ("ok"), or why the file could not be checked."""
    conn = sqlite3.connect(db)
    try:
        rows = conn.execute("PRAGMA integrity_check").fetchall()
    except sqlite3.DatabaseError as exc:
        return f"cannot check: {exc}"
    finally:
        conn.close()
    return "; ".join(str(r[0]) for r in rows)


def behind(acks: Acks | Sequence[Ack], db: Path) -> list[str]:
    """``lost`` against the file, as lines; one line saying why when it cannot be read."""
    try:
        rows = final_rows(db)
    except sqlite3.DatabaseError as exc:
        return [f"none of the records can be read ({exc})"]
    missing = lost(acks, rows)
    total = len(acks.records if isinstance(acks, Acks) else acks)
    return [f"{len(missing)} of {total} acknowledged writes lost: {missing[:4]}"] if missing else []


def final_rows(db: Path) -> dict[str, Row]:
    conn = sqlite3.connect(db)
    try:
        rows = conn.execute("SELECT name, state, version, update_ns FROM operations").fetchall()
    finally:
        conn.close()
    return {
        name: Row(int(version), state, (RANK[parse_state(state)], int(update_ns)))
        for name, state, version, update_ns in rows
    }


def quarantined_ids(db: Path) -> set[str]:
    conn = sqlite3.connect(db)
    try:
        return {r[0] for r in conn.execute("SELECT webhook_id FROM quarantine")}
    finally:
        conn.close()


def lost(acks: Acks | Sequence[Ack], rows: dict[str, Row]) -> list[str]:
    """Every acknowledgement the file is behind (a lost write), as a line."""
    out = []
    for ack in acks.records if isinstance(acks, Acks) else acks:
        row = rows.get(ack.name)
        if row is None:
            out.append(f"{ack.name} ({ack.via}, v{ack.version} {ack.state}) is missing")
            continue
        rank = RANK[parse_state(ack.state)]
        if row.version < ack.version or row.key[0] < rank or (ack.key and row.key < ack.key):
            out.append(f"{ack.name} ({ack.via}, v{ack.version} {ack.state}) is at {row}")
    return out


def deleted_handles(pid: int, db: Path) -> list[str]:
    """The files of ``db`` (the database, its -wal, its -shm) that process ``pid`` still holds
    open although they were deleted (Linux's /proc; [] elsewhere)."""
    fds = Path(f"/proc/{pid}/fd")
    if not fds.is_dir():
        return []
    out = []
    for fd in fds.iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith(str(db)) and target.endswith("(deleted)"):
            out.append(target)
    return out


class Watch:
    """Samples, while the run lasts, whether the -wal / -shm of ``db`` exist and whether a
    serve process holds a deleted one (what issue 30 saw: serve writing into a WAL another
    process had deleted)."""

    def __init__(self, db: Path, pids: Callable[[], Sequence[int]], *, sides: bool = True) -> None:
        self.db = db
        self.pids = pids
        self.sides = sides  # False when serve is killed: the last process may delete them
        self.vanished: set[str] = set()
        self.held_deleted: set[str] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Watch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _run(self) -> None:
        while not self._stop.wait(0.1):
            pids = list(self.pids())
            for suffix in ("-wal", "-shm") if self.sides else ():
                side = self.db.with_name(self.db.name + suffix)
                if pids and not side.exists():
                    self.vanished.add(side.name)
            for pid in pids:
                self.held_deleted.update(deleted_handles(pid, self.db))


def problems(
    acks: Acks, db: Path, *, watch: Watch | None = None, extra: Sequence[str] = ()
) -> list[str]:
    """Everything wrong at the end of a run, each as a line with its numbers (empty: none):
    the file's integrity, acknowledged writes it lacks, errors any process saw, HTTP 5xx other
    than 503, WAL files deleted under a living serve."""
    out = list(extra)
    checked = integrity(db)
    if checked != "ok":
        out.append(f"integrity_check: {checked[:300]}")
    out += behind(acks, db)
    try:
        kept = quarantined_ids(db)
    except sqlite3.DatabaseError as exc:
        out.append(f"the quarantine cannot be read: {exc}")
        kept = set()
    gone = [w for w in acks.quarantined if w not in kept]
    if gone:
        out.append(f"{len(gone)} of {len(acks.quarantined)} quarantined deliveries lost")
    if acks.errors:
        out.append(f"{len(acks.errors)} errors, the first: {acks.errors[:3]}")
    bad = {s: n for s, n in acks.statuses.items() if s >= 500 and s != 503}
    if bad:
        out.append(f"HTTP 5xx other than 503: {bad}")
    if watch is not None and (watch.vanished or watch.held_deleted):
        out.append(
            f"deleted under a living serve: {sorted(watch.vanished)}; "
            f"still held: {sorted(watch.held_deleted)[:4]}"
        )
    return out


# -- who opens the store's files (issue 33's retry paths) ---------------------------------------

# A ``sitecustomize`` for the child processes: an audit hook (PEP 578) that records every
# Python-level open, link, rename, removal or truncation of the database, its -wal, -shm or
# -journal, with the opstate frame that asked for it. SQLite opens its files in C, past the
# hook: whatever it records was opened by something other than SQLite.
_AUDIT_HOOK = """
import json, os, sys
_log, _db = os.environ.get("OPSTATE_TEST_FILE_AUDIT"), os.environ.get("OPSTATE_TEST_FILE_AUDIT_DB")
if _log and _db:
    _fd = os.open(_log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    _paths = {_db + s for s in ("", "-wal", "-shm", "-journal")}
    _events = {"open", "os.link", "os.rename", "os.remove", "os.truncate", "os.symlink",
               "os.chmod", "shutil.copyfile", "shutil.move"}

    def _who():
        frame = sys._getframe(2)
        while frame is not None:
            name = frame.f_code.co_filename
            if "/opstate/" in name and "/tests/" not in name:
                return name[name.rindex("/opstate/") + 1:] + ":" + frame.f_code.co_name
            frame = frame.f_back
        return "?"

    def _hook(event, args):
        if event not in _events:
            return
        for arg in args[:2]:
            if isinstance(arg, (str, bytes)) or hasattr(arg, "__fspath__"):
                path = os.fsdecode(os.fspath(arg))
                if os.path.abspath(path) in _paths:
                    line = {"event": event, "path": path, "who": _who(), "argv": sys.argv[1:3]}
                    os.write(_fd, (json.dumps(line) + "\\n").encode())

    sys.addaudithook(_hook)
"""

# What may touch the store's files outside SQLite: ``create_database_file`` hard-links a new
# empty file to the database's name (it never opens it: issue 30).
ALLOWED_TOUCHES = frozenset({("os.link", "opstate/private_files.py:create_database_file")})


def audit_env(folder: Path, db: Path) -> dict[str, str]:
    """The environment entries that make a child process record who touches ``db``'s files
    (``touches``): ``PYTHONPATH`` gains a folder holding the hook as ``sitecustomize``."""
    hooks = folder / "audit-hook"
    hooks.mkdir(exist_ok=True)
    (hooks / "sitecustomize.py").write_text(_AUDIT_HOOK)
    return {
        "PYTHONPATH": os.pathsep.join([str(hooks), cli_env()["PYTHONPATH"]]),
        "OPSTATE_TEST_FILE_AUDIT": str(folder / "audit.jsonl"),
        "OPSTATE_TEST_FILE_AUDIT_DB": str(db.resolve()),
    }


def touches(folder: Path) -> list[dict[str, object]]:
    """Every touch of the store's files the hook recorded (``audit_env``)."""
    log = folder / "audit.jsonl"
    if not log.exists():
        return []
    return [json.loads(line) for line in log.read_text().splitlines() if line.strip()]


def outside_sqlite(folder: Path) -> list[str]:
    """The recorded touches no rule allows, as lines."""
    return [
        f"{t['event']} {t['path']} by {t['who']} in opstate {t['argv']}"
        for t in touches(folder)
        if (t["event"], t["who"]) not in ALLOWED_TOUCHES
    ]
