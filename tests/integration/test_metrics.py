"""``GET /metrics`` of one process on SQLite and PostgreSQL: counts follow what was done, the
database facts are read at scrape time, and a stuck database cannot hold a scrape."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import select

from genhook.db import Task
from tests.conftest import Harness, make_harness, make_settings
from tests.support.images import data_url

MODEL = "test/fake-edit"


def parse(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def value(samples: dict[Any, float], name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


async def scrape(h: Harness, **headers: str) -> dict[Any, float]:
    response = await h.client.get("/metrics", headers=headers)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/plain")
    return parse(response.text)


async def submit(h: Harness, prompt: str) -> str:
    body = {"model": MODEL, "prompt": prompt, "images": [data_url()], "size": "1024*1024"}
    response = await h.submit(body)
    assert response.status_code == 200, response.text
    task_id: str = response.json()["id"]
    return task_id


async def test_counts_follow_the_tasks_run(harness: Harness) -> None:
    # The registry is the process's own: compare with what it showed before.
    before = await scrape(harness)
    for prompt in ("edit sleep=0.05", "edit", "fail"):
        await submit(harness, prompt)
    await asyncio.sleep(1.1)  # past the database facts' one-second reuse
    waiting = await scrape(harness)
    assert value(waiting, "genhook_metrics_database_up") == 1
    assert value(waiting, "genhook_tasks_waiting", model=MODEL) == 3
    assert value(waiting, "genhook_task_oldest_waiting_seconds", model=MODEL) >= 0
    assert value(waiting, "genhook_webhook_outbox_pending") == 0

    assert await harness.run_all() == 3
    await asyncio.sleep(1.1)  # past the database facts' one-second reuse
    after = await scrape(harness)

    def delta(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    assert delta("genhook_tasks_submitted_total", model=MODEL) == 3
    assert delta("genhook_tasks_started_total", model=MODEL) == 3
    assert delta("genhook_tasks_finished_total", model=MODEL, outcome="completed") == 2
    assert delta("genhook_tasks_finished_total", model=MODEL, outcome="failed") == 1
    assert delta("genhook_task_run_seconds_count", model=MODEL, outcome="completed") == 2
    # The sleeping engine ran at least its sleep: a lower bound, not a timing claim.
    assert delta("genhook_task_run_seconds_sum", model=MODEL, outcome="completed") >= 0.05
    assert value(after, "genhook_tasks_waiting", model=MODEL) == 0
    assert all("account" not in str(key) and "task_id" not in str(key) for key in after)


async def test_replayed_submit_is_not_counted_again(harness: Harness) -> None:
    before = await scrape(harness)
    body = {"model": MODEL, "prompt": "edit", "images": [data_url()], "size": "1024*1024"}
    headers = {**harness.headers, "Idempotency-Key": "once"}
    for _ in range(2):
        response = await harness.client.post(
            "/api/v1/model/generateImage", json=body, headers=headers
        )
        assert response.status_code == 200, response.text
    after = await scrape(harness)
    submitted = "genhook_tasks_submitted_total"
    assert value(after, submitted, model=MODEL) - value(before, submitted, model=MODEL) == 1


async def test_lease_losses_are_counted(harness: Harness) -> None:
    before = await scrape(harness)
    lifecycle = harness.worker.lifecycle
    await submit(harness, "edit")
    settings = harness.state.settings
    # A worker dies holding the task, until the task has lost too many leases and fails.
    for _ in range(settings.max_lease_losses):
        assert (await lifecycle.claim("w-dead", [MODEL])).tasks
        assert await lifecycle.release_owner("w-dead", lost=True) == 1
    after = await scrape(harness)
    losses = "genhook_task_lease_losses_total"
    requeued = value(after, losses, outcome="requeued") - value(before, losses, outcome="requeued")
    failed = value(after, losses, outcome="failed") - value(before, losses, outcome="failed")
    assert (requeued, failed) == (settings.max_lease_losses - 1, 1)
    async with harness.state.db.read() as session:
        statuses = sorted((await session.scalars(select(Task.status))).all())
    assert statuses == ["failed"]


async def test_token_guards_metrics(tmp_path: Path, database_url: str) -> None:
    settings = make_settings(tmp_path, database_url, metrics_token="s3cret")
    h = await make_harness(settings)
    try:
        for headers in ({}, {"Authorization": "Bearer wrong"}):
            response = await h.client.get("/metrics", headers=headers)
            assert response.status_code == 401
            assert response.json()["code"] == 401
        samples = await scrape(h, Authorization="Bearer s3cret")
        assert value(samples, "genhook_metrics_database_up") == 1
    finally:
        await h.client.aclose()
        await h.state.db.dispose()


@pytest.mark.postgres
async def test_a_stuck_database_does_not_hold_a_scrape(tmp_path: Path, pg_url: str) -> None:
    settings = make_settings(tmp_path, pg_url, metrics_database_timeout_seconds=0.3)
    h = await make_harness(settings)
    dsn = pg_url.replace("postgresql+asyncpg://", "postgresql://")
    blocker = await asyncpg.connect(dsn)
    try:
        await asyncio.sleep(1.1)  # past any earlier test's reading
        async with blocker.transaction():
            await blocker.execute("LOCK TABLE tasks IN ACCESS EXCLUSIVE MODE")
            samples = await scrape(h)
            assert value(samples, "genhook_metrics_database_up") == 0
            assert ("genhook_tasks_waiting", ()) not in samples
        await asyncio.sleep(1.1)
        samples = await scrape(h)
        assert value(samples, "genhook_metrics_database_up") == 1
    finally:
        await blocker.close()
        await h.client.aclose()
        await h.state.db.dispose()
