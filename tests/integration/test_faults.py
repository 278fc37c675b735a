"""Faults of the service's own infrastructure, in-process on SQLite and PostgreSQL: a full disk
while storing outputs, an unreachable database, overload, a backlog past its deadlines, and a
dead worker's leases."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import subprocess
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import func, select, update
from starlette.types import Receive, Scope, Send

from genhook.api import build_state, create_app
from genhook.api.shedding import LoadShedding
from genhook.db import Task, UsageLine, WebhookDelivery, now_ms
from genhook.errors import ErrorCode
from genhook.storage import FileBlobStore
from tests.conftest import Harness, make_harness, make_settings
from tests.support.images import data_url
from tests.support.postgres import free_port

MODEL = "test/fake-edit"


async def submit(h: Harness, **fields: Any) -> str:
    body: dict[str, Any] = {"model": MODEL, "prompt": "edit", "images": [data_url()]}
    body.update(fields)
    response = await h.submit(body)
    assert response.status_code == 200, response.text
    task_id: str = response.json()["id"]
    return task_id


async def row(h: Harness, task_id: str) -> Task:
    async with h.state.db.read() as session:
        task = await session.get(Task, task_id)
    assert task is not None
    return task


@contextlib.contextmanager
def small_disk(path: Path, size: str = "2m") -> Iterator[bool]:
    """A real small file system at ``path`` (tmpfs) where the platform lets us mount one;
    yields False where it does not (the caller then injects ENOSPC at the storage port)."""
    path.mkdir(parents=True, exist_ok=True)
    mounted = (
        os.geteuid() == 0
        and subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
            capture_output=True,
        ).returncode
        == 0
    )
    try:
        yield mounted
    finally:
        if mounted:
            subprocess.run(["umount", "-l", str(path)], capture_output=True)


def fill(path: Path) -> Path:
    """Fill the file system holding ``path`` to the last byte."""
    filler = path / "filler"
    with filler.open("wb", buffering=0) as handle:
        with contextlib.suppress(OSError):
            while True:
                handle.write(b"\0" * 65536)
        with contextlib.suppress(OSError):
            while True:
                handle.write(b"\0")
    return filler


class FullDisk(FileBlobStore):
    """The outside world's full disk, where no small file system can be mounted: the
    storage port answers ENOSPC, as the kernel would, until ``full`` is cleared."""

    full = False

    async def put(self, key: str, data: bytes, content_type: str) -> None:
        if self.full:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), key)
        await super().put(key, data, content_type)


@pytest.fixture
async def disk_harness(tmp_path: Path, database_url: str) -> AsyncIterator[tuple[Harness, bool]]:
    # A 2 MB disk is always under the free-space margin: off here, to see the disk fill up.
    settings = make_settings(tmp_path, database_url, fault_retry_seconds=0.3, min_free_disk_mb=0)
    with small_disk(settings.data_dir) as mounted:
        h = await make_harness(settings)
        if not mounted:
            h.state.storage = h.worker.storage = FullDisk(settings.data_dir / "blobs")
        try:
            yield h, mounted
        finally:
            await h.client.aclose()
            await h.state.db.dispose()


async def test_full_disk_requeues_the_task_unharmed(disk_harness: tuple[Harness, bool]) -> None:
    h, mounted = disk_harness
    task_id = await submit(h, size="1024*1024", output_format="png")
    filler = None
    if mounted:
        filler = fill(h.state.settings.data_dir)
        ready = await h.client.get("/readyz")
        assert ready.status_code == 503, ready.text
        assert "data directory" in ready.json()["message"]
        assert ready.headers["retry-after"] == "1"
    else:
        FullDisk.full = True
    try:
        assert await h.worker.run_turn()
    finally:
        FullDisk.full = False
    task = await row(h, task_id)
    # Not the engine's fault, nor the task's: back in the queue, no error, no lost lease.
    assert (task.status, task.error_code, task.lease_losses) == ("created", None, 0)
    assert task.available_at > now_ms()
    if filler is not None:
        filler.unlink()
        assert (await h.client.get("/readyz")).status_code == 200
    async with h.state.db.write() as session:
        await session.execute(update(Task).where(Task.id == task_id).values(available_at=0))
    assert await h.worker.run_turn()
    result = await h.result(task_id)
    assert result["status"] == "completed", result
    async with h.state.db.read() as session:
        billed = await session.scalar(select(func.count()).select_from(UsageLine))
    assert billed == 1


async def test_unreachable_database_answers_503(tmp_path: Path) -> None:
    # Nothing listens on this port: every connection is refused, as during a restart.
    url = f"postgresql+asyncpg://postgres@127.0.0.1:{free_port()}/none"
    settings = make_settings(tmp_path, url, db_connect_timeout_seconds=2)
    state = build_state(settings)
    app = create_app(state)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as client:
        response = await client.post(
            "/api/v1/model/generateImage",
            json={"model": MODEL, "prompt": "edit", "images": [data_url()]},
            headers={"Authorization": "Bearer ghk_" + "a" * 43},
        )
        assert response.status_code == 503, response.text
        assert response.headers["retry-after"] == "1"
        assert set(response.json()) == {"code", "message", "errors"}
        ready = await client.get("/readyz")
        assert ready.status_code == 503 and "database" in ready.json()["message"]
    await state.db.dispose()


async def test_overload_is_refused_at_once() -> None:
    release = asyncio.Event()
    entered = asyncio.Event()

    async def slow(scope: Scope, receive: Receive, send: Send) -> None:
        entered.set()
        await release.wait()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    app = LoadShedding(slow, limit=1)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
        first = asyncio.create_task(client.get("/api/v1/usage"))
        await entered.wait()
        refused = await client.get("/api/v1/usage")
        assert refused.status_code == 503
        assert refused.headers["retry-after"] == "1"
        assert refused.json()["code"] == 503
        release.set()
        assert (await first).status_code == 200
        # Health probes are never shed, and a freed slot is usable again.
        assert app.active == 0


async def test_backlog_past_its_deadline_expires_in_bulk(harness: Harness) -> None:
    ids = [await submit(harness, webhook_url="http://127.0.0.1:9/hook") for _ in range(60)]
    async with harness.state.db.write() as session:
        await session.execute(update(Task).values(deadline_at=now_ms() - 1))
    # Nothing that cannot finish before its deadline is started.
    assert not await harness.worker.run_turn()
    changed = await harness.worker.lifecycle.expire_overdue(now_ms(), batch=25)
    assert changed == 60
    async with harness.state.db.read() as session:
        statuses = (await session.execute(select(Task.status, Task.error_code))).all()
        billed = await session.scalar(select(func.count()).select_from(UsageLine))
        outbox = await session.scalar(select(func.count()).select_from(WebhookDelivery))
    assert set(statuses) == {("timeout", int(ErrorCode.TIMEOUT))}
    assert (billed, outbox) == (0, len(ids))


async def test_task_without_time_to_finish_is_not_started(harness: Harness) -> None:
    harness.state.settings.task_start_margin_seconds = 5.0
    task_id = await submit(harness)
    async with harness.state.db.write() as session:
        await session.execute(update(Task).values(deadline_at=now_ms() + 3000))
    assert not await harness.worker.run_turn()
    assert (await row(harness, task_id)).status == "created"
    async with harness.state.db.write() as session:
        await session.execute(update(Task).values(deadline_at=now_ms() + 60_000))
    assert await harness.worker.run_turn()
    assert (await row(harness, task_id)).status == "completed"


async def test_dead_workers_tasks_are_requeued_at_once(harness: Harness) -> None:
    lifecycle = harness.worker.lifecycle
    first = await submit(harness)
    claim = await lifecycle.claim("host:1/0", [MODEL])
    assert [task.id for task in claim.tasks] == [first]
    # The supervisor saw the worker die: requeued now, not when the lease runs out.
    assert await lifecycle.release_owner("host:1/0", lost=True) == 1
    task = await row(harness, first)
    assert (task.status, task.lease_owner, task.lease_losses) == ("created", None, 1)
    # A worker stopped on purpose costs the task nothing.
    await lifecycle.claim("host:2/0", [MODEL])
    assert await lifecycle.release_owner("host:2/0", lost=False) == 1
    assert (await row(harness, first)).lease_losses == 1
    # The lease-loss limit still ends a task that keeps killing its workers.
    harness.state.settings.max_lease_losses = 2
    await lifecycle.claim("host:3/0", [MODEL])
    assert await lifecycle.release_owner("host:3/0", lost=True) == 1
    task = await row(harness, first)
    assert (task.status, task.error_code) == ("failed", int(ErrorCode.WORKER_LOST))


async def test_a_storage_outage_charges_no_timeout_and_pauses_claims(
    tmp_path: Path, database_url: str
) -> None:
    """The task's deadline falls while its worker retries storing its outputs: the task goes
    back to the queue unharmed with its deadline moved on (not ``timeout``), and the worker
    claims nothing more until storage takes writes again."""
    settings = make_settings(
        tmp_path, database_url, fault_retry_seconds=2, min_free_disk_mb=0, worker_poll_seconds=0.05
    )
    h = await make_harness(settings)
    h.state.storage = h.worker.storage = FullDisk(settings.data_dir / "blobs")
    try:
        task_id = await submit(h, output_format="png")
        waiting = await submit(h, output_format="png")
        deadline = now_ms() + 1000  # inside the 2 s of retries
        async with h.state.db.write() as session:
            await session.execute(
                update(Task).where(Task.id == task_id).values(deadline_at=deadline)
            )
        FullDisk.full = True
        assert await h.worker.run_turn()
        task = await row(h, task_id)
        assert (task.status, task.error_code, task.lease_losses) == ("created", None, 0)
        assert task.deadline_at > max(now_ms(), deadline)  # moved on by the run's time
        # Storage still refuses writes: nothing is claimed.
        assert not await h.worker.run_turn()
        assert (await row(h, waiting)).status == "created"
        FullDisk.full = False
        for _ in range(100):  # the next probe write, within a poll
            if await h.worker.run_turn():
                break
            await asyncio.sleep(0.05)
        assert (await h.result(waiting))["status"] == "completed"
    finally:
        FullDisk.full = False
        await h.client.aclose()
        await h.state.db.dispose()
