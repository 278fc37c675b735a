from __future__ import annotations

import asyncio
import contextlib
import re
import secrets
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, runtime_checkable

from genhook.config import Settings
from genhook.db import Database, now_ms
from genhook.files import DIR_MODE, private_dir, write_private

_KEY_RE = re.compile(r"^[A-Za-z0-9_-]{1,64}(/[A-Za-z0-9_.-]{1,100}){0,3}$")


def new_blob_key(prefix: str, suffix: str = "") -> str:
    """An unguessable key: 192 random bits, so output URLs cannot be enumerated."""
    return f"{prefix}/{secrets.token_urlsafe(24)}{suffix}"


def valid_key(key: str) -> bool:
    return bool(_KEY_RE.match(key)) and ".." not in key


class BlobStore(Protocol):
    async def put(self, key: str, data: bytes, content_type: str) -> None: ...

    async def get(self, key: str) -> tuple[bytes, str] | None: ...

    async def delete(self, key: str) -> None: ...


@dataclass(frozen=True, slots=True)
class BlobInfo:
    size: int
    content_type: str


@runtime_checkable
class BucketBlobStore(BlobStore, Protocol):
    """A store that serves part of a blob without reading it whole, and can hand out a
    short-lived URL of it (``storage/s3.py``); outputs in one are never held in memory."""

    async def info(self, key: str) -> BlobInfo | None: ...

    async def open_range(self, key: str, first: int, last: int) -> AsyncIterator[bytes]: ...

    async def presigned_url(self, key: str) -> str: ...


CONTENT_TYPE_BY_EXTENSION = {
    ".jpeg": "image/jpeg",
    ".jpg": "image/jpeg",
    ".png": "image/png",
    ".webp": "image/webp",
    ".bmp": "image/bmp",
    ".tiff": "image/tiff",
    ".gif": "image/gif",
    ".heic": "image/heic",
    ".heif": "image/heif",
    ".mp3": "audio/mpeg",
    ".wav": "audio/wav",
    ".ogg": "audio/ogg",
    ".flac": "audio/flac",
    ".json": "application/json",
    ".srt": "application/x-subrip",
    ".mp4": "video/mp4",
    ".webm": "video/webm",
    ".mov": "video/quicktime",
    ".m4a": "audio/mp4",
    ".aac": "audio/aac",
    ".txt": "text/plain",
    ".csv": "text/csv",
    ".bin": "application/octet-stream",
}


def extension_of(content_type: str) -> str:
    for extension, known in CONTENT_TYPE_BY_EXTENSION.items():
        if known == content_type:
            return extension
    raise ValueError(f"no blob extension for content type {content_type!r}")


def content_type_of(key: str) -> str:
    dot = key.rfind(".")
    return CONTENT_TYPE_BY_EXTENSION.get(key[dot:] if dot > key.rfind("/") else "", "")


class FileBlobStore:
    """Blobs as files. Keys end in an extension that names the content type, so a blob is
    one file write; keys are unique and referenced only after the write, so readers never
    see a partial file."""

    def __init__(self, root: Path) -> None:
        self.root = root.resolve()
        private_dir(self.root)

    def _path(self, key: str) -> Path:
        if not valid_key(key):
            raise ValueError(f"invalid blob key {key!r}")
        return self.root / key

    def _write(self, path: Path, data: bytes) -> None:
        try:
            write_private(path, data)
        except FileNotFoundError:
            path.parent.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
            write_private(path, data)

    def _read(self, path: Path) -> tuple[bytes, str] | None:
        try:
            data = path.read_bytes()
        except (FileNotFoundError, IsADirectoryError):
            return None
        return data, content_type_of(path.name) or "application/octet-stream"

    async def put(self, key: str, data: bytes, content_type: str) -> None:
        if content_type_of(key) != content_type:
            raise ValueError(f"blob key {key!r} does not end in the extension of {content_type}")
        path = self._path(key)
        if len(data) < 256 * 1024:
            self._write(path, data)
        else:
            await asyncio.to_thread(self._write, path, data)

    async def get(self, key: str) -> tuple[bytes, str] | None:
        try:
            path = self._path(key)
        except ValueError:
            return None
        return await asyncio.to_thread(self._read, path)

    async def delete(self, key: str) -> None:
        with contextlib.suppress(FileNotFoundError, ValueError):
            self._path(key).unlink()


class DatabaseBlobStore:
    def __init__(self, db: Database) -> None:
        self.db = db

    async def put(self, key: str, data: bytes, content_type: str) -> None:
        if not valid_key(key):
            raise ValueError(f"invalid blob key {key!r}")
        from genhook.tasks.store.writes import put_blob  # the blobs table's one writer

        values = {"key": key, "content_type": content_type, "data": data, "created_at": now_ms()}
        async with self.db.write() as session:
            await put_blob(session, values, postgres=self.db.is_postgres)

    async def get(self, key: str) -> tuple[bytes, str] | None:
        from genhook.tasks.store.reads import blob

        async with self.db.read() as session:
            return await blob(session, key)

    async def delete(self, key: str) -> None:
        from genhook.tasks.store.writes import delete_blob

        async with self.db.write() as session:
            await delete_blob(session, key)


async def close_blob_store(store: BlobStore) -> None:
    """Close what a store holds on the loop (a bucket client's connection pool)."""
    close = getattr(store, "aclose", None)
    if close is not None:
        await close()


def open_blob_store(settings: Settings, db: Database) -> BlobStore:
    """``GENHOOK_STORAGE=database``, else ``GENHOOK_BLOB_STORE``: a bucket or a directory."""
    if settings.storage == "database":
        return DatabaseBlobStore(db)
    target = settings.blob_store
    if target and target.startswith("s3:"):
        from genhook.storage.s3 import S3BlobStore, parse_s3_url  # aiobotocore only if used

        return S3BlobStore(settings, parse_s3_url(target))
    return FileBlobStore(Path(target) if target else settings.data_dir / "blobs")
