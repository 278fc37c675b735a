"""Bounded history on SQLite and PostgreSQL: old webhook attempts and finished tasks are
pruned in batches; the billing ledger stays."""

from __future__ import annotations

from typing import Any

from sqlalchemy import func, select, update

from genhook.db import Task, UsageLine, WebhookAttempt, WebhookDelivery, WebhookReplay, now_ms
from genhook.sender.deliveries import redeliver
from genhook.tasks.retention import DAY_MS, Pruner
from tests.conftest import Harness
from tests.support.images import data_url

MODEL = "test/fake-edit"


async def submit(h: Harness, **fields: Any) -> str:
    body: dict[str, Any] = {"model": MODEL, "prompt": "edit", "images": [data_url()]}
    body.update(fields)
    response = await h.submit(body)
    assert response.status_code == 200, response.text
    task_id: str = response.json()["id"]
    return task_id


async def count(h: Harness, table: Any) -> int:
    async with h.state.db.read() as session:
        return int(await session.scalar(select(func.count()).select_from(table)) or 0)


async def test_old_attempts_and_tasks_are_pruned(harness: Harness) -> None:
    h = harness
    old, recent = [
        await submit(h, webhook_url="http://127.0.0.1:9/hook", size="1024*1024") for _ in range(2)
    ]
    assert await h.run_all() == 2
    long_ago = now_ms() - 40 * DAY_MS
    async with h.state.db.write() as session:
        deliveries = {
            task_id: delivery_id
            for delivery_id, task_id in (
                await session.execute(select(WebhookDelivery.id, WebhookDelivery.task_id))
            ).all()
        }
        await session.execute(update(WebhookDelivery).values(status="delivered"))
        for number in range(7):
            for task_id, started in ((old, long_ago), (recent, now_ms())):
                session.add(
                    WebhookAttempt(
                        delivery_id=deliveries[task_id],
                        number=number + 1,
                        started_at=started + number,
                        duration_ms=1,
                    )
                )
        await session.execute(update(Task).where(Task.id == old).values(finished_at=long_ago))
    (output,) = (await h.result(old))["outputs"]
    key = output.split("/api/v1/outputs/", 1)[1]
    assert await h.state.storage.get(key) is not None

    pruner = Pruner(h.state.settings, h.state.db, h.state.storage, batch=3)
    # Attempts only by default (30 days); tasks are kept unless a retention is set.
    assert await pruner.prune() == (7, 0)
    assert await count(h, WebhookAttempt) == 7
    h.state.settings.task_retention_days = 30
    assert await pruner.prune() == (0, 1)
    async with h.state.db.read() as session:
        left = set((await session.scalars(select(Task.id))).all())
    assert left == {recent}
    assert await count(h, WebhookDelivery) == 1
    assert await count(h, WebhookAttempt) == 7
    assert await h.state.storage.get(key) is None
    # The billing ledger outlives the task.
    assert await count(h, UsageLine) == 2


async def test_a_redelivered_task_is_pruned_with_its_replays(harness: Harness) -> None:
    h = harness
    task_id = await submit(h, webhook_url="http://127.0.0.1:9/hook", size="1024*1024")
    assert await h.run_all() == 1
    async with h.state.db.read() as session:
        (delivery_id,) = (await session.scalars(select(WebhookDelivery.id))).all()
    await redeliver(h.state.db, delivery_id, account_id=None)
    assert await count(h, WebhookReplay) == 1
    long_ago = now_ms() - 40 * DAY_MS
    async with h.state.db.write() as session:
        await session.execute(update(WebhookDelivery).values(status="delivered"))
        await session.execute(update(Task).where(Task.id == task_id).values(finished_at=long_ago))
    pruner = Pruner(h.state.settings, h.state.db, h.state.storage)
    assert await pruner.prune_tasks(now_ms() - 30 * DAY_MS) == 1
    assert await count(h, Task) == 0
    assert await count(h, WebhookDelivery) == 0
    assert await count(h, WebhookReplay) == 0
