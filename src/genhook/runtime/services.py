"""The five services every part of genhook is built from, in one bundle.

The API's state, the submitter and the worker all need the settings, the database, the blob
store, the model registry and the address policy; they extend ``Services`` instead of each
listing the five again, and ``open_services`` is the one place that opens them.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Self

from genhook.config import Settings
from genhook.db import Database
from genhook.engines.registry import Registry, build_registry
from genhook.files import disk_problem
from genhook.net import AddressPolicy, Resolver
from genhook.storage import BlobStore, open_blob_store


@dataclass
class Services:
    settings: Settings
    db: Database
    storage: BlobStore
    registry: Registry
    policy: AddressPolicy

    @classmethod
    def sharing(cls, other: Services, **extra: Any) -> Self:
        """A ``cls`` built on the same five services as ``other`` (plus its own fields)."""
        return cls(other.settings, other.db, other.storage, other.registry, other.policy, **extra)


def open_services(
    settings: Settings,
    *,
    registry: Registry | None = None,
    resolver: Resolver | None = None,
    db: Database | None = None,
    claims: bool = False,
) -> Services:
    """Open what ``settings`` describe; ``registry``, ``resolver`` and ``db`` replace the
    defaults (tests, benchmarks, a supervisor's own database handle). ``claims``: this
    process claims from the queues: on PostgreSQL it plans without bitmap scans."""
    db = db or Database(
        settings.resolved_database_url,
        pool_timeout=settings.db_pool_timeout_seconds,
        connect_timeout=settings.db_connect_timeout_seconds,
        claims=claims,
    )
    return Services(
        settings=settings,
        db=db,
        storage=open_blob_store(settings, db),
        registry=registry or build_registry(settings),
        policy=AddressPolicy(
            allow_private=settings.webhook_allow_private_targets, resolver=resolver
        ),
    )


async def ready_problems(state: Services) -> list[str]:
    """What keeps this process from doing its work: an empty list when it is ready."""
    problems: list[str] = []
    try:
        await asyncio.wait_for(state.db.check_writable(), state.settings.db_pool_timeout_seconds)
    except Exception as exc:
        problems.append(f"the database cannot be written ({type(exc).__name__}: {exc})")
    try:
        await asyncio.to_thread(_probe_directory, state.settings.data_dir)
    except OSError as exc:
        problems.append(f"the data directory cannot be written ({exc.strerror or exc})")
    disk = disk_problem(state.settings, state.db)
    if disk is not None:
        problems.append(disk)
    return problems


_PROBE = b"\0" * 4096


def _probe_directory(directory: Path) -> None:
    """Write, flush and remove a small file: fails with ENOSPC on a full disk."""
    path = os.path.join(directory, f".ready-{os.getpid()}")
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.write(fd, _PROBE)
            os.fsync(fd)
        finally:
            os.close(fd)
    finally:
        with contextlib.suppress(OSError):
            os.unlink(path)
