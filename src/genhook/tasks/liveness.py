"""A standalone worker's liveness on PostgreSQL, tied to a database session.

Under ``genhook serve`` the supervisor sees a worker die and gives its tasks back at once. A
worker started on its own (``genhook worker``) has nobody watching it but its lease, which
runs for ``GENHOOK_LEASE_SECONDS`` (30 s). So on PostgreSQL such a worker holds a session
advisory lock, keyed by its lease owner name, on a connection of its own for as long as it
runs (``hold_liveness``), and names itself with ``LIVE_SUFFIX``. When the process dies its
connection closes with it and the server lets go of the lock at once; the sweeper then finds
a task held by a ``LIVE_SUFFIX`` owner whose lock nobody holds (``dead_owners``) and requeues
it within a few seconds, counted as a lost lease. The lease stays the safety net (a machine
cut off without its connection closing). A lock missing only for a moment (a database
restart drops every session; the worker takes its lock again as it reconnects) is not a
death: an owner must be seen without its lock for ``LIVENESS_GRACE_SECONDS`` first.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import zlib
from collections.abc import AsyncIterator, Iterable
from typing import Any

from sqlalchemy import text
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncSession

from genhook.db.held_connection import hold_connection

log = logging.getLogger(__name__)

# The end of a lease owner name whose liveness is its advisory lock.
LIVE_SUFFIX = "+live"
# The first key of every liveness lock ("gh" and 1), apart from any other advisory lock.
NAMESPACE = 0x67680001
# How long an owner must be seen without its lock before its tasks are requeued.
LIVENESS_GRACE_SECONDS = 2.0
# How often the holder checks that its connection (and so its lock) is still there.
CHECK_SECONDS = 5.0


def lock_key(owner: str) -> int:
    """The second key of ``owner``'s lock: a signed 32-bit hash of its name. Two owners that
    share one only keep each other's tasks waiting for their lease: never a wrong requeue."""
    value = zlib.crc32(owner.encode())
    return value - (1 << 32) if value >= 1 << 31 else value


@contextlib.asynccontextmanager
async def hold_liveness(database_url: str, owner: str) -> AsyncIterator[None]:
    """Hold ``owner``'s lock while the block runs; the block starts once it is held."""
    holder = _Holder(database_url, owner)
    task = asyncio.create_task(holder.run())
    try:
        await holder.held.wait()
        yield
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


class _Holder:
    def __init__(self, database_url: str, owner: str) -> None:
        url = make_url(database_url).set(drivername="postgresql")
        self.dsn = url.render_as_string(hide_password=False)
        self.owner = owner
        self.held = asyncio.Event()

    async def run(self) -> None:
        await hold_connection(
            self.dsn,
            self._lock,
            on_lost=self._lost,
            check_seconds=CHECK_SECONDS,
            base=0.1,
            cap=2.0,
        )

    async def _lock(self, connection: Any) -> None:
        await connection.execute("SELECT pg_advisory_lock($1, $2)", NAMESPACE, lock_key(self.owner))
        self.held.set()

    def _lost(self, error: Exception) -> None:
        log.warning("worker %s: liveness connection lost (%s)", self.owner, error)


class DeathWatch:
    """The sweeper's side: which ``LIVE_SUFFIX`` owners have been without their lock for
    ``LIVENESS_GRACE_SECONDS`` (remembered between sweeps, per sweeping process)."""

    def __init__(self, grace: float = LIVENESS_GRACE_SECONDS) -> None:
        self.grace = grace
        self._missing_since: dict[str, float] = {}

    async def dead_owners(self, session: AsyncSession, owners: Iterable[str]) -> list[str]:
        live = [owner for owner in set(owners) if owner.endswith(LIVE_SUFFIX)]
        if not live:
            self._missing_since.clear()
            return []
        held = set(
            (
                await session.execute(
                    text(
                        "SELECT objid::bigint FROM pg_locks WHERE locktype = 'advisory' "
                        "AND classid = :namespace AND objsubid = 2 AND granted"
                    ),
                    {"namespace": NAMESPACE},
                )
            )
            .scalars()
            .all()
        )
        now = asyncio.get_running_loop().time()
        dead = []
        for owner in live:
            if lock_key(owner) & 0xFFFFFFFF in held:
                self._missing_since.pop(owner, None)
            elif now - self._missing_since.setdefault(owner, now) >= self.grace:
                dead.append(owner)
        for owner in set(self._missing_since) - set(live):
            del self._missing_since[owner]
        return dead
