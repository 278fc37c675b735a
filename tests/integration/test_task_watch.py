"""Waiting and watching through the real app and worker, on SQLite and PostgreSQL:
``Prefer: wait``, queue position, progress and logs, the event stream and the listing."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from sqlalchemy import func, select

from genhook.accounts import create_account
from genhook.client import AsyncClient, InvalidRequest
from genhook.db import Task, TaskEvent
from genhook.tasks.progress import MAX_LOG_LINES
from tests.conftest import Harness
from tests.support.images import data_url

MODEL = "test/fake-edit"
PLAIN_KEYS = {"id", "model", "status", "outputs", "has_nsfw_contents", "created_at", "urls"}


def body(**fields: Any) -> dict[str, Any]:
    base: dict[str, Any] = {"model": MODEL, "prompt": "make it pop", "images": [data_url()]}
    base.update(fields)
    return base


async def submit(h: Harness, **fields: Any) -> str:
    response = await h.submit(body(**fields))
    assert response.status_code == 200, response.text
    task_id: str = response.json()["id"]
    return task_id


@contextlib.asynccontextmanager
async def worker_running(h: Harness) -> AsyncIterator[None]:
    stop = asyncio.Event()
    run = asyncio.create_task(h.worker.run(stop))
    try:
        yield
    finally:
        stop.set()
        await asyncio.wait_for(run, 30)


def parse_sse(text: str) -> list[dict[str, Any]]:
    events = []
    for block in text.split("\n\n"):
        fields: dict[str, str] = {}
        for line in block.splitlines():
            if line.startswith(":"):
                continue
            name, _, value = line.partition(": ")
            fields[name] = value
        if "data" in fields:
            events.append(
                {**json.loads(fields["data"]), "event_id": fields["id"], "event": fields["event"]}
            )
    return events


def fields_of(response: Any) -> dict[str, str]:
    data = response.json()
    assert data["code"] == response.status_code
    return {e["field"]: e["message"] for e in data["errors"]}


async def task_count(h: Harness) -> int:
    async with h.state.db.read() as session:
        return int((await session.execute(select(func.count()).select_from(Task))).scalar_one())


async def test_plain_requests_answer_as_before(harness: Harness) -> None:
    submitted = await harness.submit(body())
    assert set(submitted.json()) == PLAIN_KEYS
    assert "preference-applied" not in submitted.headers
    await harness.run_all()
    done = await harness.result(submitted.json()["id"])
    assert set(done) == PLAIN_KEYS | {"info", "completed_at", "outputs_expire_at"}


async def test_queue_position_counts_tasks_ahead_for_the_model(harness: Harness) -> None:
    ids = [await submit(harness) for _ in range(3)]
    other = await harness.submit(body(model="test/fake-audio"), path="generateAudio")
    assert [(await harness.result(i))["queue_position"] for i in ids] == [0, 1, 2]
    assert (await harness.result(other.json()["id"]))["queue_position"] == 0
    assert await harness.worker.run_turn()
    first = await harness.result(ids[0])
    assert "queue_position" not in first and first["status"] == "completed"
    assert [(await harness.result(i))["queue_position"] for i in ids[1:]] == [0, 1]


async def test_prefer_wait_on_submit_returns_the_finished_task(harness: Harness) -> None:
    async with worker_running(harness):
        response = await harness.client.post(
            "/api/v1/model/generateImage",
            json=body(prompt="sleep=0.3"),
            headers={**harness.headers, "Prefer": "wait=30"},
        )
    assert response.status_code == 200, response.text
    data = response.json()
    assert response.headers["preference-applied"] == "wait=30"
    assert data["status"] == "completed"
    assert len(data["outputs"]) == 1 and data["outputs"][0].startswith("http://testserver/")


async def test_prefer_wait_runs_out_and_answers_the_task_as_it_is(harness: Harness) -> None:
    # No worker runs: the wait ends with the task still queued, in the normal shape.
    response = await harness.client.post(
        "/api/v1/model/generateImage",
        json=body(),
        headers={**harness.headers, "Prefer": "respond-async, wait=1"},
    )
    assert response.status_code == 200
    assert response.json()["status"] == "created"
    assert response.json()["queue_position"] == 0
    task_id = response.json()["id"]
    result = await harness.client.get(
        f"/api/v1/model/result/{task_id}", headers={**harness.headers, "Prefer": "wait=1"}
    )
    assert result.json()["status"] == "created"
    async with worker_running(harness):
        waited = await harness.client.get(
            f"/api/v1/model/result/{task_id}", headers={**harness.headers, "Prefer": "wait"}
        )
    assert waited.json()["status"] == "completed"
    assert waited.headers["preference-applied"] == "wait=60"


@pytest.mark.parametrize("prefer", ["wait=soon", "wait=-1", "wait=1.5"])
async def test_bad_prefer_wait_is_rejected_before_anything_is_created(
    harness: Harness, prefer: str
) -> None:
    response = await harness.client.post(
        "/api/v1/model/generateImage", json=body(), headers={**harness.headers, "Prefer": prefer}
    )
    assert response.status_code == 400
    assert "whole seconds" in fields_of(response)["Prefer"]
    assert await task_count(harness) == 0


async def test_progress_and_logs_reach_the_result(harness: Harness) -> None:
    task_id = await submit(harness, prompt="sleep=0.6 steps=3")
    async with worker_running(harness):
        seen: list[dict[str, Any]] = []
        for _ in range(300):
            result = await harness.result(task_id)
            seen.append(result)
            if result["status"] == "completed":
                break
            await asyncio.sleep(0.02)
    running = [r for r in seen if r["status"] == "processing"]
    assert all("started_at" in r and "queue_position" not in r for r in running)
    assert all(0 <= r.get("progress", 0) <= 1 for r in running)
    assert "progress" not in seen[-1] and "logs" not in seen[-1]
    response = await harness.client.get(
        f"/api/v1/model/result/{task_id}?logs=1", headers=harness.headers
    )
    logs = response.json()["logs"]
    assert [line["message"] for line in logs] == [f"step {n} of 3" for n in (1, 2, 3)]
    assert all(line["at"].endswith("Z") for line in logs)
    async with harness.state.db.read() as session:
        last = await session.scalar(
            select(TaskEvent.progress)
            .where(TaskEvent.task_id == task_id, TaskEvent.progress.is_not(None))
            .order_by(TaskEvent.id.desc())
        )
    assert last == 1.0
    bad = await harness.client.get(
        f"/api/v1/model/result/{task_id}?logs=maybe", headers=harness.headers
    )
    assert bad.status_code == 400 and "logs" in fields_of(bad)


async def test_log_lines_are_capped_per_task(harness: Harness) -> None:
    task_id = await submit(harness, prompt=f"steps={MAX_LOG_LINES + 50}")
    assert await harness.worker.run_turn()
    async with harness.state.db.read() as session:
        lines = await session.scalar(
            select(func.count())
            .select_from(TaskEvent)
            .where(TaskEvent.task_id == task_id, TaskEvent.message.is_not(None))
        )
    assert lines == MAX_LOG_LINES


async def test_image_edit_engine_reports_progress(harness: Harness) -> None:
    task_id = await submit(harness, model="genhook/image-edit", prompt="black and white")
    assert await harness.worker.run_turn()
    response = await harness.client.get(
        f"/api/v1/model/result/{task_id}?logs=1", headers=harness.headers
    )
    data = response.json()
    assert data["status"] == "completed", data
    messages = [line["message"] for line in data["logs"]]
    assert messages[0].startswith("plan: ") and messages[-1].startswith("encoded jpeg")


async def events(h: Harness, task_id: str, last: str | None = None) -> list[dict[str, Any]]:
    headers = dict(h.headers)
    if last is not None:
        headers["Last-Event-ID"] = last
    response = await h.client.get(f"/api/v1/model/result/{task_id}/events", headers=headers)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/event-stream")
    return parse_sse(response.text)


async def test_event_stream_follows_the_task_to_its_end(harness: Harness) -> None:
    task_id = await submit(harness, prompt="sleep=0.6 steps=3")
    async with worker_running(harness):
        stream = await events(harness, task_id)
    assert stream[0]["event"] in ("created", "processing")
    assert stream[-1]["event"] == "completed" and len(stream[-1]["outputs"]) == 1
    assert all(event["event"] == event["status"] for event in stream)
    assert len({event["event_id"] for event in stream}) == len(stream)
    # Each log line arrives once, in order, across the events.
    lines = [line["message"] for event in stream for line in event.get("logs", [])]
    assert lines == ["step 1 of 3", "step 2 of 3", "step 3 of 3"]


async def test_event_stream_resumes_after_the_last_event_id(harness: Harness) -> None:
    task_id = await submit(harness, prompt="steps=3")
    assert await harness.worker.run_turn()
    async with harness.state.db.read() as session:
        first = await session.scalar(
            select(func.min(TaskEvent.id)).where(TaskEvent.task_id == task_id)
        )
    resumed = await events(harness, task_id, f"processing:{first}")
    assert [event["event"] for event in resumed] == ["completed"]
    assert [line["message"] for line in resumed[0]["logs"]] == ["step 2 of 3", "step 3 of 3"]
    full = await events(harness, task_id)
    assert len(full) == 1 and len(full[0]["logs"]) == 3
    # The terminal event's own id: nothing is left to send.
    assert await events(harness, task_id, full[0]["event_id"]) == []


async def test_failed_task_ends_the_stream(harness: Harness) -> None:
    task_id = await submit(harness, prompt="fail")
    async with worker_running(harness):
        stream = await events(harness, task_id)
    assert stream[-1]["event"] == "failed" and stream[-1]["error_code"]


async def test_event_stream_errors(harness: Harness) -> None:
    task_id = await submit(harness)
    url = f"/api/v1/model/result/{task_id}/events"
    bad = await harness.client.get(url, headers={**harness.headers, "Last-Event-ID": "x"})
    assert bad.status_code == 400 and "Last-Event-ID" in fields_of(bad)
    missing = await harness.client.get("/api/v1/model/result/nope/events", headers=harness.headers)
    assert missing.status_code == 404
    other = await create_account(harness.state.db, "other")
    foreign = await harness.client.get(url, headers={"Authorization": f"Bearer {other.api_key}"})
    assert foreign.status_code == 404
    assert (await harness.client.get(url)).status_code == 401


async def list_page(h: Harness, query: str) -> dict[str, Any]:
    response = await h.client.get(f"/api/v1/model/results?{query}", headers=h.headers)
    assert response.status_code == 200, response.text
    data: dict[str, Any] = response.json()
    return data


async def test_listing_pages_newest_first_with_filters(harness: Harness) -> None:
    ids = [await submit(harness) for _ in range(5)]
    audio = await harness.submit(body(model="test/fake-audio"), path="generateAudio")
    ids.append(audio.json()["id"])
    failing = await harness.submit(body(prompt="fail"))
    ids.append(failing.json()["id"])
    await harness.run_all()
    other = await create_account(harness.state.db, "other")
    await harness.client.post(
        "/api/v1/model/generateImage",
        json=body(),
        headers={"Authorization": f"Bearer {other.api_key}"},
    )

    seen: list[str] = []
    cursor = None
    while True:
        page = await list_page(harness, "limit=2" + (f"&cursor={cursor}" if cursor else ""))
        assert len(page["items"]) <= 2
        seen += [item["id"] for item in page["items"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert sorted(seen) == sorted(ids) and len(seen) == 7
    created = [item["created_at"] for item in (await list_page(harness, "limit=100"))["items"]]
    assert created == sorted(created, reverse=True)

    failed = await list_page(harness, "status=failed")
    assert [item["id"] for item in failed["items"]] == [ids[-1]]
    assert failed["items"][0]["status"] == "failed"
    audio_only = await list_page(harness, "model=test/fake-audio")
    assert [item["id"] for item in audio_only["items"]] == [ids[5]]
    both = await list_page(harness, "status=completed,failed&limit=100")
    assert len(both["items"]) == 7
    assert (await list_page(harness, "since=2100-01-01T00:00:00Z"))["items"] == []
    assert len((await list_page(harness, "since=2000-01-01T00:00:00Z"))["items"]) == 7


@pytest.mark.parametrize(
    ("query", "field"),
    [
        ("status=done", "status"),
        ("limit=0", "limit"),
        ("limit=101", "limit"),
        ("limit=ten", "limit"),
        ("cursor=%%%", "cursor"),
        ("cursor=bm9wZQ", "cursor"),
        ("since=yesterday", "since"),
        ("since=2026-01-01T00:00:00", "since"),
    ],
)
async def test_listing_rejects_bad_parameters(harness: Harness, query: str, field: str) -> None:
    response = await harness.client.get(f"/api/v1/model/results?{query}", headers=harness.headers)
    assert response.status_code == 400
    assert field in fields_of(response)


async def test_async_sdk_waits_streams_and_lists(harness: Harness) -> None:
    sdk = AsyncClient(
        harness.account.api_key, base_url="http://testserver", http_client=harness.client
    )
    images = [data_url()]
    async with worker_running(harness):
        done = await sdk.submit(MODEL, prompt="sleep=0.2", images=images, wait=30)
        assert done.status == "completed" and done.outputs
        running = await sdk.submit(MODEL, prompt="sleep=0.4 steps=2", images=images)
        seen = [event async for event in sdk.events(running.id)]
    assert seen[-1].done and seen[-1].event == "completed"
    assert [line.message for e in seen for line in e.prediction.logs] == [
        "step 1 of 2",
        "step 2 of 2",
    ]
    with_logs = await sdk.result(running.id, wait=1, logs=True)
    assert [line.message for line in with_logs.logs] == ["step 1 of 2", "step 2 of 2"]
    page = await sdk.tasks(limit=1, status=["completed"])
    assert [item.id for item in page.items] == [running.id] and page.next_cursor
    rest = await sdk.tasks(limit=1, status="completed", cursor=page.next_cursor)
    assert [item.id for item in rest.items] == [done.id] and rest.next_cursor is None
    with pytest.raises(InvalidRequest) as bad:
        await sdk.tasks(status="done")
    assert bad.value.errors[0].field == "status"
