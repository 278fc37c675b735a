"""The roles' division of work, in process: the API runs nothing in the background, and the
dispatcher role is what recovers expired task leases."""

from __future__ import annotations

import asyncio

from sqlalchemy import update

from genhook.api import build_state, create_app
from genhook.db import Task, now_ms
from genhook.runtime.roles import DispatcherRole
from genhook.tasks import Lifecycle
from tests.conftest import Harness
from tests.integration.test_lifecycle import MODEL, row, submit


async def test_the_api_starts_no_background_task(harness: Harness) -> None:
    state = build_state(harness.state.settings, registry=harness.state.registry)
    app = create_app(state)
    before = asyncio.all_tasks()
    async with app.router.lifespan_context(app):
        await asyncio.sleep(0.1)
        assert asyncio.all_tasks() - before == set()


async def test_the_dispatcher_role_recovers_an_expired_task_lease(harness: Harness) -> None:
    task_id = await submit(harness)
    lifecycle = Lifecycle(harness.state.settings, harness.state.db, harness.state.storage)
    assert (await lifecycle.claim("dead-1", [MODEL])).tasks
    async with harness.state.db.write() as session:
        await session.execute(
            update(Task).where(Task.id == task_id).values(lease_expires_at=now_ms() - 1)
        )
    state = build_state(harness.state.settings, registry=harness.state.registry)
    role = DispatcherRole(state)
    stop = asyncio.Event()
    run = asyncio.create_task(role.run(stop))
    try:
        async with asyncio.timeout(30):
            while (task := await row(harness, task_id)).status != "created":
                await asyncio.sleep(0.05)
        assert task.lease_losses == 1 and task.lease_owner is None
    finally:
        stop.set()
        await run
        await state.db.dispose()
