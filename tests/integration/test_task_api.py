"""Cancel, idempotent submit, submit limits, start deadlines and output retention, through
the HTTP API on SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import func, select

from genhook.accounts import create_account
from genhook.api import build_state, create_app
from genhook.db import Blob, ExpiredOutput, IdempotencyKey, Task, UsageLine, WebhookDelivery
from genhook.engines.registry import build_registry
from genhook.errors import ErrorCode
from genhook.tasks import Lifecycle
from genhook.tasks.admission import set_account_limits
from genhook.tasks.retention import Retention
from tests.conftest import Harness, make_harness, make_settings
from tests.support.images import data_url

MODEL = "test/fake-edit"
HOOK = "http://127.0.0.1:9/hook"  # never called: these tests read the outbox row


def body(**fields: Any) -> dict[str, Any]:
    base: dict[str, Any] = {"model": MODEL, "prompt": "edit", "images": [data_url()]}
    base.update(fields)
    return base


async def submit(
    h: Harness, headers: dict[str, str] | None = None, **fields: Any
) -> httpx.Response:
    merged = {**h.headers, **(headers or {})}
    return await h.client.post("/api/v1/model/generateImage", json=body(**fields), headers=merged)


async def submit_id(h: Harness, **fields: Any) -> str:
    response = await submit(h, **fields)
    assert response.status_code == 200, response.text
    task_id: str = response.json()["id"]
    return task_id


async def cancel(h: Harness, task_id: str) -> httpx.Response:
    return await h.client.post(f"/api/v1/model/result/{task_id}/cancel", headers=h.headers)


async def row(h: Harness, task_id: str) -> Task:
    async with h.state.db.read() as session:
        task = await session.get(Task, task_id)
    assert task is not None
    return task


async def count(h: Harness, model: Any, *where: Any) -> int:
    async with h.state.db.read() as session:
        value = await session.scalar(select(func.count()).select_from(model).where(*where))
    return int(value or 0)


async def callback(h: Harness, task_id: str) -> dict[str, Any]:
    async with h.state.db.read() as session:
        delivery = (
            await session.scalars(select(WebhookDelivery).where(WebhookDelivery.task_id == task_id))
        ).one()
    data: dict[str, Any] = json.loads(delivery.body)
    return data


Tuned = Callable[..., Awaitable[Harness]]


@pytest.fixture
async def tuned(tmp_path: Path, database_url: str) -> AsyncIterator[Tuned]:
    """Makes a harness with settings overrides."""
    made: list[Harness] = []

    async def make(**overrides: Any) -> Harness:
        h = await make_harness(make_settings(tmp_path, database_url, **overrides))
        made.append(h)
        return h

    yield make
    for h in made:
        await h.client.aclose()
        await h.state.db.dispose()


# Cancel


async def test_cancel_waiting_task_ends_it_unbilled_with_a_callback(harness: Harness) -> None:
    created = await submit(harness, webhook_url=HOOK)
    view = created.json()
    task_id = view["id"]
    assert view["urls"]["cancel"] == f"http://testserver/api/v1/model/result/{task_id}/cancel"

    answer = await cancel(harness, task_id)
    assert answer.status_code == 200, answer.text
    canceled = answer.json()
    assert canceled["status"] == "canceled"
    assert canceled["error_code"] == ErrorCode.CANCELED
    assert canceled["outputs"] == []
    assert (await harness.result(task_id))["status"] == "canceled"
    # Nothing left to run, nothing billed, inputs gone, and the callback says canceled.
    assert not await harness.worker.run_turn()
    assert await count(harness, UsageLine, UsageLine.task_id == task_id) == 0
    assert await count(harness, Blob, Blob.key.like(f"inputs/{task_id}%")) == 0
    hook = await callback(harness, task_id)
    assert hook["status"] == "ERROR"
    assert hook["payload"]["status"] == "canceled"
    assert hook["error"] == "The task was canceled."

    again = await cancel(harness, task_id)
    assert again.status_code == 409
    assert again.json()["errors"] == [{"field": "status", "message": "canceled"}]


async def test_cancel_of_finished_unknown_and_foreign_tasks(harness: Harness) -> None:
    done = await submit_id(harness)
    assert await harness.run_all() == 1
    answer = await cancel(harness, done)
    assert answer.status_code == 409
    assert "completed" in answer.json()["message"]
    assert (await harness.result(done))["status"] == "completed"

    assert (await cancel(harness, "0" * 32)).status_code == 404
    assert (await cancel(harness, "x" * 300)).status_code == 404
    other = await create_account(harness.state.db, "other")
    waiting = await submit_id(harness)
    foreign = await harness.client.post(
        f"/api/v1/model/result/{waiting}/cancel",
        headers={"Authorization": f"Bearer {other.api_key}"},
    )
    assert foreign.status_code == 404
    assert foreign.json()["code"] == 404
    assert (await row(harness, waiting)).status == "created"


async def test_cancel_running_task_asks_the_engine_to_stop(
    harness: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="genhook")
    task_id = await submit_id(harness, prompt="wait=60")
    run = asyncio.create_task(harness.worker.run_turn())
    for _ in range(500):
        if (await row(harness, task_id)).status == "processing":
            break
        await asyncio.sleep(0.02)
    answer = await cancel(harness, task_id)
    assert answer.json()["status"] == "canceled"
    # The worker learns it at its next heartbeat, the engine stops early, and the
    # worker process stays in service (no engine thread left computing).
    assert await asyncio.wait_for(run, 30)
    assert not harness.worker.tainted
    task = await row(harness, task_id)
    assert task.status == "canceled" and task.outputs == [] and task.lease_owner is None
    assert await count(harness, UsageLine) == 0
    # Logged as what it was: a cancel, not a lost lease, and not as a failure.
    said = [(r.levelno, r.getMessage()) for r in caplog.records if task_id in r.getMessage()]
    assert (logging.INFO, f"task {task_id}: canceled by its owner; its run is abandoned") in said
    assert all(level < logging.WARNING and "failed" not in line for level, line in said), said


async def test_cancel_running_task_whose_engine_cannot_stop(harness: Harness) -> None:
    task_id = await submit_id(harness, prompt="sleep=4")
    run = asyncio.create_task(harness.worker.run_turn())
    for _ in range(500):
        if (await row(harness, task_id)).status == "processing":
            break
        await asyncio.sleep(0.02)
    assert (await cancel(harness, task_id)).status_code == 200
    await asyncio.wait_for(run, 30)
    # The worker stopped waiting for it, as at a deadline; the process is due for replacement.
    assert harness.worker.tainted
    assert (await row(harness, task_id)).status == "canceled"
    assert await count(harness, UsageLine) == 0


async def test_cancel_racing_completion_has_one_outcome(harness: Harness) -> None:
    ids = [await submit_id(harness, webhook_url=HOOK) for _ in range(6)]

    async def cancel_later(task_id: str, delay: float) -> int:
        await asyncio.sleep(delay)
        return (await cancel(harness, task_id)).status_code

    answers = await asyncio.gather(
        harness.run_all(), *(cancel_later(t, 0.01 * i) for i, t in enumerate(ids))
    )
    for task_id, code in zip(ids, answers[1:], strict=True):
        task = await row(harness, task_id)
        billed = await count(harness, UsageLine, UsageLine.task_id == task_id)
        hook = await callback(harness, task_id)
        assert hook["payload"]["status"] == task.status
        if task.status == "completed":
            assert code == 409 and billed == 1 and task.outputs
        else:
            assert task.status == "canceled"
            assert code == 200 and billed == 0 and task.outputs == []


# Idempotent submit


async def test_idempotency_key_replays_the_first_task(harness: Harness) -> None:
    key = {"Idempotency-Key": "order-42"}
    first = await submit(harness, key)
    second = await submit(harness, key)
    assert first.status_code == second.status_code == 200
    assert second.json()["id"] == first.json()["id"]
    assert await count(harness, Task) == 1

    # Once it ran, the replay shows the task as it stands, outputs included; no new charge.
    assert await harness.run_all() == 1
    third = (await submit(harness, key)).json()
    assert third["id"] == first.json()["id"] and third["status"] == "completed"
    assert await count(harness, UsageLine) == 1

    conflict = await submit(harness, key, prompt="something else")
    assert conflict.status_code == 409
    assert conflict.json()["errors"][0]["field"] == "Idempotency-Key"
    assert await count(harness, Task) == 1

    # Keys are per account; without a key, nothing changes.
    other = await create_account(harness.state.db, "other")
    theirs = await harness.client.post(
        "/api/v1/model/generateImage",
        json=body(),
        headers={"Authorization": f"Bearer {other.api_key}", **key},
    )
    assert theirs.status_code == 200 and theirs.json()["id"] != first.json()["id"]
    assert (await submit(harness)).json()["id"] != first.json()["id"]


async def test_invalid_idempotency_key_and_start_deadline_are_400(harness: Harness) -> None:
    for headers, field in [
        ({"Idempotency-Key": ""}, "Idempotency-Key"),
        ({"Idempotency-Key": "k" * 256}, "Idempotency-Key"),
        ({"X-Start-Deadline": "soon"}, "X-Start-Deadline"),
        ({"X-Start-Deadline": "0"}, "X-Start-Deadline"),
        ({"X-Start-Deadline": "nan"}, "X-Start-Deadline"),
    ]:
        answer = await submit(harness, headers)
        assert answer.status_code == 400, headers
        assert answer.json()["errors"][0]["field"] == field
    assert await count(harness, Task) == 0


async def test_twenty_parallel_retries_make_one_task(harness: Harness) -> None:
    headers = {"Idempotency-Key": "retry-storm"}
    answers = await asyncio.gather(*(submit(harness, headers) for _ in range(20)))
    assert {a.status_code for a in answers} == {200}
    assert len({a.json()["id"] for a in answers}) == 1
    assert await count(harness, Task) == 1
    assert await count(harness, IdempotencyKey) == 1


async def test_idempotency_key_expires(tuned: Tuned) -> None:
    h = await tuned(idempotency_key_ttl_seconds=0.2)
    headers = {"Idempotency-Key": "short-lived"}
    first = (await submit(h, headers)).json()["id"]
    await asyncio.sleep(0.3)
    second = (await submit(h, headers, prompt="another body is fine now")).json()["id"]
    assert second != first
    await asyncio.sleep(0.3)
    report = await Retention(h.state.settings, h.state.db, h.state.storage).run_once()
    assert report.idempotency_keys == 1
    assert await count(h, IdempotencyKey) == 0


# Limits


async def test_token_bucket_is_shared_by_api_processes(tuned: Tuned) -> None:
    h = await tuned(rate_limit_per_second=0.5, rate_limit_burst=2)
    assert (await submit(h)).status_code == 200
    # A second api process (own engine, pool and caches) draws on the same bucket.
    state = build_state(h.state.settings, registry=build_registry(h.state.settings))
    app = create_app(state)
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://testserver"
    ) as other:
        second = await other.post("/api/v1/model/generateImage", json=body(), headers=h.headers)
        third = await other.post("/api/v1/model/generateImage", json=body(), headers=h.headers)
    await state.db.dispose()
    assert second.status_code == 200
    assert third.status_code == 429
    assert int(third.headers["Retry-After"]) >= 1
    assert third.json()["errors"][0]["field"] == "submits_per_second"
    assert await count(h, Task) == 2
    # Refused submits created nothing and the bucket refills at its own pace only.
    assert (await submit(h)).status_code == 429


async def test_in_flight_limit_holds_under_parallel_submits(tuned: Tuned) -> None:
    h = await tuned(max_tasks_in_flight=3)
    answers = await asyncio.gather(*(submit(h) for _ in range(10)))
    codes = sorted(a.status_code for a in answers)
    assert codes == [200] * 3 + [429] * 7
    refused = next(a for a in answers if a.status_code == 429)
    assert refused.headers["Retry-After"] == "1"
    assert refused.json()["errors"][0]["field"] == "tasks_in_flight"
    assert await count(h, Task) == 3
    # A slot frees when a task ends (here: canceled).
    first = next(a for a in answers if a.status_code == 200).json()["id"]
    assert (await cancel(h, first)).status_code == 200
    assert (await submit(h)).status_code == 200


async def test_account_override_of_limits(tuned: Tuned) -> None:
    h = await tuned(auth_cache_seconds=0)
    account = h.account.account_id
    await set_account_limits(h.state.db, account, per_second=None, burst=None, in_flight=1)
    assert (await submit(h)).status_code == 200
    assert (await submit(h)).status_code == 429
    other = await create_account(h.state.db, "other")
    for _ in range(2):
        answer = await h.client.post(
            "/api/v1/model/generateImage",
            json=body(),
            headers={"Authorization": f"Bearer {other.api_key}"},
        )
        assert answer.status_code == 200
    await set_account_limits(
        h.state.db, account, per_second=None, burst=None, in_flight=None, clear=True
    )
    assert (await submit(h)).status_code == 200


# Start deadline


async def test_task_not_started_in_time_ends_timeout_unbilled(harness: Harness) -> None:
    late = (await submit(harness, {"X-Start-Deadline": "0.2"}, webhook_url=HOOK)).json()["id"]
    punctual = (await submit(harness, {"X-Start-Deadline": "60"})).json()["id"]
    await asyncio.sleep(0.3)
    # Past its start deadline it is never claimed, and the sweeper ends it.
    lifecycle = Lifecycle(harness.state.settings, harness.state.db, harness.state.storage)
    assert await lifecycle.sweep() == 1
    result = await harness.result(late)
    assert result["status"] == "failed"  # polling shows timeout as failed, as ever
    assert result["error_code"] == ErrorCode.TIMEOUT
    assert "did not start" in result["error"]
    assert (await row(harness, late)).status == "timeout"
    hook = await callback(harness, late)
    assert hook["payload"]["status"] == "timeout" and "did not start" in hook["payload"]["error"]
    assert await harness.run_all() == 1
    assert (await row(harness, punctual)).status == "completed"
    assert await count(harness, UsageLine, UsageLine.task_id == late) == 0


# Retention


async def test_retention_deletes_outputs_in_bounded_batches(tuned: Tuned) -> None:
    h = await tuned(output_retention=timedelta(seconds=30), retention_batch=2)
    ids = [await submit_id(h) for _ in range(3)]
    assert await h.run_all() == 3
    result = await h.result(ids[0])
    assert result["outputs_expire_at"].endswith("Z")
    url = result["outputs"][0].removeprefix("http://testserver")
    assert (await h.client.get(url)).status_code == 200

    retention = Retention(h.state.settings, h.state.db, h.state.storage)
    assert (await retention.run_once()).tasks == 0  # nothing is due yet
    later = (await row(h, ids[0])).outputs_expire_at
    assert later is not None
    assert (await retention.run_once(now=later + 60_000)).tasks == 2
    assert (await retention.run_once(now=later + 60_000)).tasks == 1
    assert (await retention.run_once(now=later + 60_000)).tasks == 0

    gone = await h.client.get(url)
    assert gone.status_code == 410
    assert gone.json()["code"] == 410 and "expired" in gone.json()["message"]
    assert (await h.client.get("/api/v1/outputs/outputs/guess.png")).status_code == 404
    # The task keeps its history.
    kept = await h.result(ids[0])
    assert kept["status"] == "completed" and kept["outputs"] == result["outputs"]
    assert await count(h, ExpiredOutput) == 3
    assert await count(h, UsageLine) == 3
