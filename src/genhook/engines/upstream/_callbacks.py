"""Where upstream queue callbacks land: one ``upstream_callbacks`` row per waiting task.

The worker writes a random token before it submits, the API stores the body the provider
posts to the token's URL, and the worker reads it back; any API process on any machine can
take the callback, because the row is in the shared database.
"""

from __future__ import annotations

import secrets
from typing import Any

from sqlalchemy import ColumnElement, Delete, and_, delete, insert, select, update

from genhook.config import Settings
from genhook.db import Database, now_ms
from genhook.db.models import UpstreamCallback


class CallbackBox:
    def __init__(self, settings: Settings) -> None:
        self._settings = settings
        self._db: Database | None = None

    @property
    def db(self) -> Database:
        if self._db is None:
            self._db = Database(self._settings.resolved_database_url, pool_size=2)
        return self._db

    async def open(self, task_id: str) -> str:
        """A fresh callback URL for ``task_id``; a previous attempt's URL stops working."""
        token = secrets.token_urlsafe(32)
        async with self.db.write() as session:
            await session.execute(self._delete(task_id))
            await session.execute(
                insert(UpstreamCallback).values(task_id=task_id, token=token, created_at=now_ms())
            )
        base = self._settings.resolved_public_base_url
        return f"{base}/api/v1/upstream/callback/{task_id}/{token}"

    async def received(self, task_id: str) -> Any | None:
        async with self.db.read() as session:
            row = (
                await session.execute(
                    select(UpstreamCallback.body).where(
                        UpstreamCallback.task_id == task_id,
                        UpstreamCallback.received_at.is_not(None),
                    )
                )
            ).first()
        return None if row is None else row[0]

    async def close(self, task_id: str) -> None:
        async with self.db.write() as session:
            await session.execute(self._delete(task_id))

    @staticmethod
    def _delete(task_id: str) -> Delete:
        return delete(UpstreamCallback).where(UpstreamCallback.task_id == task_id)

    async def aclose(self) -> None:
        if self._db is not None:
            await self._db.dispose()


def _waiting(task_id: str, token: str) -> ColumnElement[bool]:
    return and_(
        UpstreamCallback.task_id == task_id[:40],
        UpstreamCallback.token == token[:64],
        UpstreamCallback.received_at.is_(None),
    )


async def callback_waiting(db: Database, task_id: str, token: str) -> bool:
    """Whether a task waits for a callback with this token: checked before the body is read,
    so a guessed URL costs one indexed read, never the reading of a body."""
    async with db.read() as session:
        row = (
            await session.execute(select(UpstreamCallback.task_id).where(_waiting(task_id, token)))
        ).first()
    return row is not None


async def store_callback(db: Database, task_id: str, token: str, body: Any) -> bool:
    """Keep the first body posted to a waiting task's callback URL; False when no task
    waits for this token (unknown, a previous attempt's, or already answered)."""
    async with db.write() as session:
        result = await session.execute(
            update(UpstreamCallback)
            .where(_waiting(task_id, token))
            .values(body=body, received_at=now_ms())
            .execution_options(synchronize_session=False)
        )
    return bool(result.rowcount)  # type: ignore[attr-defined]
