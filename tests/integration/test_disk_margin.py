"""A disk running out, in-process on SQLite and PostgreSQL: submits are refused before it is
full and the 503 names the cause, readiness says why, and the tasks in hand are not charged
for the outage (no timeout, no lost lease) once it is over."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import func, select, update
from sqlalchemy.exc import OperationalError

from genhook import files
from genhook.db import Task, now_ms
from genhook.faults import fault_cause
from genhook.statuses import TaskStatus
from genhook.tasks.lifecycle import Lifecycle
from tests.conftest import Harness, make_harness, make_settings
from tests.support.images import data_url

MODEL = "test/fake-edit"
BODY: dict[str, Any] = {"model": MODEL, "prompt": "edit", "images": [data_url()]}
# More free space than any disk has: the margin is never met.
HUGE_MARGIN_MB = 10**12


@pytest.fixture
async def low(tmp_path: Path, database_url: str) -> AsyncIterator[Harness]:
    h = await make_harness(make_settings(tmp_path, database_url, min_free_disk_mb=HUGE_MARGIN_MB))
    yield h
    await h.client.aclose()
    await h.state.db.dispose()


async def test_submits_are_refused_under_the_margin_naming_the_cause(low: Harness) -> None:
    response = await low.submit(BODY)
    assert response.status_code == 503, response.text
    assert "disk" in response.json()["message"]
    assert "GENHOOK_MIN_FREE_DISK_MB" in response.json()["message"]
    assert response.headers["Retry-After"] == "1"
    async with low.state.db.read() as session:
        assert await session.scalar(select(func.count()).select_from(Task)) == 0
    ready = await low.client.get("/readyz")
    assert ready.status_code == 503 and "disk" in ready.json()["message"]


async def test_a_claimed_task_is_not_charged_for_the_outage(harness: Harness) -> None:
    response = await harness.submit(BODY)
    assert response.status_code == 200, response.text
    task_id = response.json()["id"]
    state = harness.state
    claim = await Lifecycle(state.settings, state.db, state.storage).claim("w-busy", [MODEL])
    assert [task.id for task in claim.tasks] == [task_id]
    # The deadline and the lease both run out during the outage.
    now = now_ms()
    async with state.db.write() as session:
        await session.execute(
            update(Task)
            .where(Task.id == task_id)
            .values(deadline_at=now + 2000, lease_expires_at=now + 200)
        )
    sweeper = Lifecycle(state.settings, state.db, state.storage)
    margin = state.settings.min_free_disk_mb
    state.settings.min_free_disk_mb = HUGE_MARGIN_MB
    try:
        assert await sweeper.sweep() == 0
        await asyncio.sleep(2.2)
        assert await sweeper.sweep() == 0
    finally:
        state.settings.min_free_disk_mb = margin
    await sweeper.sweep()
    async with state.db.read() as session:
        task = await session.get(Task, task_id)
    assert task is not None
    assert (task.status, task.lease_losses, task.error_code) == (TaskStatus.CREATED, 0, None)
    # It has the time back that it had left when the outage began.
    assert task.deadline_at > now_ms()
    assert await harness.run_all() == 1
    assert (await harness.result(task_id))["status"] == "completed"


async def test_a_restarted_sweeper_remembers_when_the_outage_began(
    harness: Harness, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The sweeper that saw the outage begin dies during it; its successor, which only sees
    the outage go on, must still give the task the time it lost."""
    monkeypatch.setattr(files, "SHARED_MEMORY", tmp_path / "shm")
    (tmp_path / "shm").mkdir()
    response = await harness.submit(BODY)
    assert response.status_code == 200, response.text
    task_id = response.json()["id"]
    state = harness.state
    now = now_ms()
    async with state.db.write() as session:
        await session.execute(update(Task).where(Task.id == task_id).values(deadline_at=now + 1500))
    margin = state.settings.min_free_disk_mb
    state.settings.min_free_disk_mb = HUGE_MARGIN_MB
    try:
        assert await Lifecycle(state.settings, state.db, state.storage).sweep() == 0
        await asyncio.sleep(2.0)  # the deadline falls inside the outage; the sweeper restarts
        restarted = Lifecycle(state.settings, state.db, state.storage)
        assert await restarted.sweep() == 0
    finally:
        state.settings.min_free_disk_mb = margin
    await restarted.sweep()
    async with state.db.read() as session:
        task = await session.get(Task, task_id)
    assert task is not None
    assert (task.status, task.error_code) == (TaskStatus.CREATED, None)
    assert task.deadline_at > now_ms()
    # Forgiven once: the record is gone, so a later sweeper starts afresh.
    assert not list((tmp_path / "shm").rglob("outage-*"))


def test_the_503_names_a_full_disk() -> None:
    full = OperationalError("INSERT", {}, Exception("database or disk is full"))
    assert fault_cause(full) == "the disk is full"
    assert fault_cause(OSError(28, "No space left on device")) == "the disk is full"
    refused = OperationalError("SELECT 1", {}, ConnectionRefusedError(111, "refused"))
    assert "database" in fault_cause(refused)
