"""Where a task's input images live: in the database with the task row (the default, one
transaction, nothing left behind by a failed submit), or in the bucket when the blob store
is one, so the database does not carry image bytes and no two machines share a disk.

Bucket inputs are written before the task row and removed again when the row is not
written. They are deleted when a worker ends the task or a client cancels it, and in any
case (a crash in between, a deadline) with the task's outputs at the end of retention.
"""

from __future__ import annotations

import contextlib
from typing import Any

from genhook.storage.blobs import BlobStore


def keeps_inputs(store: BlobStore) -> bool:
    return bool(getattr(store, "keeps_inputs", False))


async def stage_inputs(store: BlobStore, blobs: list[dict[str, Any]]) -> list[str]:
    """Put the input blob rows of a submit into ``store`` when it keeps inputs; the keys
    written (none when the database keeps them). A failed put removes the others."""
    if not blobs or not keeps_inputs(store):
        return []
    staged: list[str] = []
    try:
        for blob in blobs:
            await store.put(blob["key"], blob["data"], blob["content_type"])
            staged.append(blob["key"])
    except BaseException:
        await discard_blobs(store, staged)
        raise
    return staged


async def discard_blobs(store: BlobStore, keys: list[str]) -> None:
    """Best effort: a blob left behind is only stray bytes, never a task without inputs."""
    for key in keys:
        with contextlib.suppress(Exception):
            await store.delete(key)


async def discard_inputs(store: BlobStore, inputs: list[dict[str, Any]]) -> None:
    """Delete an ended task's inputs from a store that keeps them (the database's go with
    the task's terminal transition)."""
    if keeps_inputs(store):
        await discard_blobs(store, [item["blob"] for item in inputs if "blob" in item])
