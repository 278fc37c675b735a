"""Files and directories private to the service's user (0700 directories, 0600 files).

The data directory holds the database (every account's webhook configuration), the key
file and stored inputs and outputs; no other local user has any business reading them.
Existing paths created by older versions with wider modes are tightened on start.
"""

from __future__ import annotations

import contextlib
import logging
import os
import stat
import time
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from genhook.config import Settings
    from genhook.db import Database

log = logging.getLogger(__name__)

# Paths named one by one in the start's log line; the rest are counted.
NAMED_CHANGES = 10

DIR_MODE = 0o700
FILE_MODE = 0o600


def private_dir(path: Path) -> None:
    """Create ``path`` (and missing parents) as 0700, or tighten it when it is ours."""
    path.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
    _tighten(path, DIR_MODE)


def private_file(path: Path) -> None:
    """Create ``path`` empty as 0600 when missing, or tighten it when it is ours."""
    with contextlib.suppress(FileExistsError):
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, FILE_MODE))
    _tighten(path, FILE_MODE)


def write_private(path: Path, data: bytes) -> None:
    """Write ``data`` to a new or existing file, created as 0600."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, FILE_MODE)
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)


def private_sqlite(database: str) -> None:
    """The SQLite file and its companions (WAL, shared memory), all 0600."""
    if not database or database == ":memory:" or database.startswith("file:"):
        return
    path = Path(database)
    private_dir(path.parent)
    private_file(path)
    for suffix in ("-wal", "-shm", "-journal", "-writer"):
        companion = Path(database + suffix)
        if companion.exists():
            _tighten(companion, FILE_MODE)


def tighten_data(settings: Settings) -> list[tuple[Path, int, int]]:
    """At start: the whole data directory (database, key file, credentials, blobs, wake-up
    sockets, metrics), and the blob and metrics directories wherever they are configured,
    tightened to 0700/0600; logs what it changed, since a wider mode was someone's doing."""
    roots = [settings.data_dir]
    if settings.storage == "file" and settings.blob_store and "://" not in settings.blob_store:
        roots.append(Path(settings.blob_store))
    if settings.metrics_dir is not None:
        roots.append(settings.metrics_dir)
    changed: list[tuple[Path, int, int]] = []
    seen: set[Path] = set()
    for root in roots:
        resolved = root.resolve()
        if any(resolved.is_relative_to(done) for done in seen):
            continue
        seen.add(resolved)
        changed += tighten_tree(resolved)
    if changed:
        named = ", ".join(
            f"{path} {old:04o} -> {new:04o}" for path, old, new in changed[:NAMED_CHANGES]
        )
        more = len(changed) - NAMED_CHANGES
        log.warning(
            "tightened the modes of %d path(s) other users could read or change: %s%s",
            len(changed),
            named,
            f" and {more} more" if more > 0 else "",
        )
    return changed


def tighten_tree(root: Path) -> list[tuple[Path, int, int]]:
    """Every directory under ``root`` (itself included) 0700 and every other entry 0600,
    where ours and wider; links are neither followed nor changed. Returns (path, old mode,
    new mode) of each path changed, for the start to say what it did."""
    changed: list[tuple[Path, int, int]] = []
    if root.is_symlink() or not root.is_dir():
        return changed
    for directory, _, files in os.walk(root):  # does not enter links to directories
        here = Path(directory)
        for path, mode in [(here, DIR_MODE)] + [(here / name, FILE_MODE) for name in files]:
            old = _tighten(path, mode)
            if old is not None:
                changed.append((path, old, mode))
    return changed


def _tighten(path: Path, mode: int) -> int | None:
    """Set ``path`` to ``mode`` when it is ours and wider; its old mode when changed."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return None
    if stat.S_ISLNK(info.st_mode):
        return None
    old = info.st_mode & 0o777
    if info.st_uid == os.getuid() and old & ~mode:
        with contextlib.suppress(PermissionError):
            os.chmod(path, mode)
            return old
    return None


# How long one look at the free space is trusted: a submit does not pay a system call each.
_DISK_CHECK_SECONDS = 0.5
_disk_checked: dict[tuple[str, int], tuple[float, str | None]] = {}


# Shared memory (tmpfs): what must survive a full data disk and a process's restart, but
# not a reboot, lives here (the metrics' count files, the sweeper's record of an outage).
SHARED_MEMORY = Path("/dev/shm")  # noqa: S108 (a private 0700 directory inside, checked)


def shared_memory_dir() -> Path | None:
    """``<shared memory>/genhook-<uid>``, made if need be, when it is a directory of this user
    alone (0700, owned by us, not a link); None without one."""
    own = SHARED_MEMORY / f"genhook-{os.getuid()}"
    try:
        if not SHARED_MEMORY.is_dir():
            return None
        with contextlib.suppress(FileExistsError):
            own.mkdir(mode=0o700)
        found = own.lstat()
    except OSError:
        return None
    if (
        stat.S_ISDIR(found.st_mode)
        and found.st_uid == os.getuid()
        and not stat.S_IMODE(found.st_mode) & 0o077
    ):
        return own
    log.warning("%s is not a private directory of this user; it is not used", own)
    return None


def disk_problem(settings: Settings, db: Database) -> str | None:
    """Why the service should take no new work, when the disk of its data directory or of
    its SQLite database is below the ``min_free_disk_mb`` margin; None while there is room."""
    directories = [settings.data_dir]
    if db.sqlite_path and db.sqlite_path != ":memory:" and not db.sqlite_path.startswith("file:"):
        directories.append(Path(db.sqlite_path).parent)
    return low_disk(directories, settings.min_free_disk_mb)


def low_disk(directories: list[Path], margin_mb: int) -> str | None:
    """Why the service should stop taking work, when a disk it writes to has less than
    ``margin_mb`` MB free (a full disk included); None while there is room."""
    if margin_mb <= 0:
        return None
    now = time.monotonic()
    for directory in directories:
        key = (str(directory), margin_mb)
        checked = _disk_checked.get(key)
        if checked is None or now - checked[0] > _DISK_CHECK_SECONDS:
            checked = (now, _free_space_problem(directory, margin_mb))
            _disk_checked[key] = checked
        if checked[1] is not None:
            return checked[1]
    return None


def _free_space_problem(directory: Path, margin_mb: int) -> str | None:
    try:
        space = os.statvfs(directory)
    except OSError:
        return None  # missing or unreadable: the writes themselves will say why
    free_mb = space.f_bavail * space.f_frsize // (1024 * 1024)
    if free_mb >= margin_mb:
        return None
    return (
        f"the disk is (nearly) full: {free_mb} MB free for {directory}, under the "
        f"{margin_mb} MB margin (GENHOOK_MIN_FREE_DISK_MB)"
    )
