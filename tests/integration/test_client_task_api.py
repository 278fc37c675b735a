"""The SDK's task API (cancel, Idempotency-Key, start deadline, retention fields) against a
scripted HTTP server on 127.0.0.1."""

from __future__ import annotations

import pytest

from genhook.client import AsyncClient, Client, Conflict, Gone, TaskFailed
from tests.integration.test_client_http import FakeApi, Reply, api, client, prediction

__all__ = ["api", "client"]  # fixtures


def test_keyed_submit_sends_its_headers_and_is_retried_like_a_read(api: FakeApi, client: Client):
    api.reply(Reply(503, {"code": 503, "message": "later"}), Reply(body=prediction()))
    created = client.submit(
        "genhook/image-edit", prompt="x", idempotency_key="order-1", start_deadline=2.5
    )
    assert created.id == "task_1"
    assert len(api.seen) == 2  # a keyed submit cannot create twice, so the 503 was retried
    for seen in api.seen:
        assert seen.headers["idempotency-key"] == "order-1"
        assert seen.headers["x-start-deadline"] == "2.5"
    api.seen.clear()
    api.reply(Reply(body=prediction()))
    client.edit("x", "https://example.test/a.png", idempotency_key="order-2")
    assert api.seen[0].headers["idempotency-key"] == "order-2"
    assert "x-start-deadline" not in api.seen[0].headers


def test_cancel_and_canceled_predictions(api: FakeApi, client: Client):
    canceled = prediction("canceled", error="The task was canceled.", error_code=4004)
    api.reply(Reply(body=canceled))
    answer = client.cancel("task/1")
    assert api.seen[0].method == "POST"
    assert api.seen[0].path == "/api/v1/model/result/task%2F1/cancel"
    assert answer.canceled and answer.done and not answer.succeeded
    with pytest.raises(TaskFailed) as failed:
        answer.raise_for_failure()
    assert failed.value.error_code == 4004
    api.reply(Reply(body=prediction("processing")), Reply(body=canceled))
    assert client.wait("task_1", poll_interval=0.01).canceled
    api.reply(
        Reply(
            409,
            {
                "code": 409,
                "message": "already completed",
                "errors": [{"field": "status", "message": "completed"}],
            },
        )
    )
    with pytest.raises(Conflict) as conflict:
        client.cancel("task_1")
    assert conflict.value.errors[0].message == "completed"


def test_outputs_expire_at_and_gone(api: FakeApi, client: Client):
    api.reply(Reply(body=prediction("completed", outputs_expire_at="2026-11-29T08:00:00.000Z")))
    assert client.result("task_1").outputs_expire_at == "2026-11-29T08:00:00.000Z"
    api.reply(Reply(410, {"code": 410, "message": "this output expired"}))
    with pytest.raises(Gone):
        client.result("task_1")


async def test_async_cancel_and_keyed_submit(api: FakeApi):
    async with AsyncClient("ghk_a", base_url=api.base_url, retry_backoff=0.01) as c:
        api.reply(Reply(body=prediction()))
        await c.submit("genhook/image-edit", prompt="x", idempotency_key="k")
        assert api.seen[-1].headers["idempotency-key"] == "k"
        api.reply(Reply(body=prediction("canceled", error_code=4004)))
        assert (await c.cancel("task_1")).canceled
        assert api.seen[-1].path == "/api/v1/model/result/task_1/cancel"
