"""Files and directories private to the service's user (0700 directories, 0600 files).

The data directory holds the database (every account's webhook configuration), the key
file and stored inputs and outputs; no other local user has any business reading them.
Existing paths created by older versions with wider modes are tightened on start.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

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


def _tighten(path: Path, mode: int) -> None:
    try:
        info = path.stat()
    except FileNotFoundError:
        return
    if info.st_uid == os.getuid() and info.st_mode & 0o777 & ~mode:
        with contextlib.suppress(PermissionError):
            os.chmod(path, mode)
