"""The surface of priorities and fair sharing, through the HTTP API on SQLite and PostgreSQL:
``priority`` on submit and its per-key bound, keys with a bound, the schema, the SDK, and
who is waiting on whom (``/api/v1/queue``, ``/api/v1/admin/queue``, ``/metrics``)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import func, select, update

from genhook.accounts import create_account, create_key
from genhook.client import AsyncClient, Forbidden, InvalidRequest
from genhook.db import AccountLimit, Task, WebhookDelivery
from genhook.tasks.admission import set_account_limits
from tests.conftest import Harness, make_harness, make_settings
from tests.support.images import data_url

MODEL = "test/fake-edit"
HOOK = "http://127.0.0.1:9/hook"  # never called: the test reads the outbox row


def body(**fields: Any) -> dict[str, Any]:
    return {"model": MODEL, "prompt": "edit", "images": [data_url()], **fields}


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


async def stored_priority(h: Harness, task_id: str) -> int:
    async with h.state.db.read() as session:
        task = await session.get(Task, task_id)
    assert task is not None
    return task.priority


async def task_count(h: Harness) -> int:
    async with h.state.db.read() as session:
        return int(await session.scalar(select(func.count()).select_from(Task)) or 0)


async def test_priority_is_stored_and_shown_when_not_normal(harness: Harness) -> None:
    h = harness
    levels = {}
    for name in ("high", "normal", "low", None):
        fields = {} if name is None else {"priority": name}
        response = await h.submit(body(**fields))
        assert response.status_code == 200, response.text
        answer = response.json()
        levels[name] = await stored_priority(h, answer["id"])
        # The answer of a task left at normal keeps the shape of a client that never sets it.
        assert answer.get("priority") == (name if name in ("high", "low") else None)
        assert (await h.result(answer["id"])).get("priority") == answer.get("priority")
    assert levels == {"high": 1, "normal": 0, "low": -1, None: 0}
    listed = await h.client.get("/api/v1/model/results", headers=h.headers)
    shown = sorted(str(item.get("priority")) for item in listed.json()["items"])
    assert shown == ["None", "None", "high", "low"]


async def test_the_webhook_payload_carries_the_priority(harness: Harness) -> None:
    h = harness
    task_id = (await h.submit(body(priority="low", webhook_url=HOOK))).json()["id"]
    await h.run_all()
    async with h.state.db.read() as session:
        delivery = (
            await session.scalars(select(WebhookDelivery).where(WebhookDelivery.task_id == task_id))
        ).one()
    assert json.loads(delivery.body)["payload"]["priority"] == "low"


@pytest.mark.parametrize("value", ["urgent", "HIGH", "", 1, True, ["high"], {"level": 1}])
async def test_a_bad_priority_is_400_naming_it_and_creates_nothing(
    harness: Harness, value: Any
) -> None:
    response = await harness.submit(body(priority=value))
    assert response.status_code == 400, response.text
    error = response.json()
    assert error["code"] == 400
    assert [e["field"] for e in error["errors"]] == ["priority"]
    assert "'high', 'normal' or 'low'" in error["errors"][0]["message"]
    assert await task_count(harness) == 0


async def test_a_null_priority_is_the_default(harness: Harness) -> None:
    response = await harness.submit(body(priority=None))
    assert response.status_code == 200, response.text
    assert await stored_priority(harness, response.json()["id"]) == 0


async def test_a_key_bound_refuses_a_higher_priority_with_403(harness: Harness) -> None:
    h = harness
    key = await create_key(h.state.db, h.account.account_id, "batch", max_priority=0)
    response = await h.client.post(
        "/api/v1/model/generateImage", json=body(priority="high"), headers=bearer(key.api_key)
    )
    assert response.status_code == 403, response.text
    error = response.json()
    assert error["code"] == 403
    assert error["errors"][0]["field"] == "priority"
    assert "may ask for normal or lower" in error["errors"][0]["message"]
    assert await task_count(h) == 0
    for name, level in (("normal", 0), ("low", -1)):
        allowed = await h.client.post(
            "/api/v1/model/generateImage", json=body(priority=name), headers=bearer(key.api_key)
        )
        assert allowed.status_code == 200, allowed.text
        assert await stored_priority(h, allowed.json()["id"]) == level
    # The account's unbounded key still may.
    assert (await h.submit(body(priority="high"))).status_code == 200


async def test_a_key_bounded_below_normal_submits_at_its_bound_by_default(
    harness: Harness,
) -> None:
    h = harness
    key = await create_key(h.state.db, h.account.account_id, "bulk", max_priority=-1)
    plain = await h.client.post(
        "/api/v1/model/generateImage", json=body(), headers=bearer(key.api_key)
    )
    assert plain.status_code == 200, plain.text
    assert plain.json()["priority"] == "low"
    assert await stored_priority(h, plain.json()["id"]) == -1
    asked = await h.client.post(
        "/api/v1/model/generateImage", json=body(priority="normal"), headers=bearer(key.api_key)
    )
    assert asked.status_code == 403
    assert "may ask for low or lower" in asked.json()["message"]


async def test_keys_api_creates_bounded_keys_never_above_its_own(harness: Harness) -> None:
    h = harness
    made = await h.client.post(
        "/api/v1/keys", json={"name": "ci", "max_priority": "normal"}, headers=h.headers
    )
    assert made.status_code == 200, made.text
    assert made.json()["max_priority"] == "normal"
    bounded = bearer(made.json()["api_key"])
    # A bounded key cannot mint a key above its bound, nor an unbounded one.
    above = await h.client.post("/api/v1/keys", json={"max_priority": "high"}, headers=bounded)
    assert above.status_code == 403, above.text
    assert above.json()["errors"][0]["field"] == "max_priority"
    inherited = await h.client.post("/api/v1/keys", json={"name": "child"}, headers=bounded)
    assert inherited.status_code == 200
    assert inherited.json()["max_priority"] == "normal"
    lower = await h.client.post("/api/v1/keys", json={"max_priority": "low"}, headers=bounded)
    assert lower.json()["max_priority"] == "low"
    wrong = await h.client.post("/api/v1/keys", json={"max_priority": "top"}, headers=h.headers)
    assert wrong.status_code == 400
    assert any(e["field"].endswith("max_priority") for e in wrong.json()["errors"])
    listed = (await h.client.get("/api/v1/keys", headers=h.headers)).json()["keys"]
    assert sorted(str(k["max_priority"]) for k in listed) == ["None", "low", "normal", "normal"]


async def test_the_schema_and_the_catalogue_describe_priority(harness: Harness) -> None:
    h = harness
    document = (await h.client.get("/openapi.json")).json()
    schemas = document["components"]["schemas"]
    members = [name for name in schemas if name.endswith("_request")]
    assert members
    for name in members:
        priority = schemas[name]["properties"]["priority"]
        assert priority["enum"] == ["high", "normal", "low"]
        assert priority["default"] == "normal"
        assert "bound" in priority["description"]
    submit = document["paths"]["/api/v1/model/generateImage"]["post"]
    assert "403" in submit["responses"]
    result = schemas["PredictionResponse"]["properties"]["priority"]
    assert result["description"]
    listed = (await h.client.get(f"/api/v1/models/{MODEL}", headers=h.headers)).json()
    assert listed["request_schema"]["properties"]["priority"]["enum"] == ["high", "normal", "low"]


async def test_the_sdk_sends_priority_and_raises_forbidden_above_the_bound(
    harness: Harness,
) -> None:
    h = harness
    async with AsyncClient(
        h.account.api_key, base_url="http://testserver", http_client=h.client
    ) as client:
        high = await client.edit("edit", data_url(), model=MODEL, priority="high")
        assert high.priority == "high"
        assert await stored_priority(h, high.id) == 1
        plain = await client.submit(MODEL, prompt="edit", images=[data_url()])
        assert plain.priority == "normal"
        with pytest.raises(InvalidRequest) as bad:
            await client.submit(MODEL, prompt="edit", images=[data_url()], priority="soon")  # type: ignore[arg-type]
        assert bad.value.errors[0].field == "priority"
    key = await create_key(h.state.db, h.account.account_id, max_priority=0)
    async with AsyncClient(key.api_key, base_url="http://testserver", http_client=h.client) as c:
        with pytest.raises(Forbidden) as refused:
            await c.submit(MODEL, prompt="edit", images=[data_url()], priority="high")
        assert refused.value.status_code == 403
        assert refused.value.errors[0].field == "priority"


# Who is waiting on whom.

Tuned = Callable[..., Awaitable[Harness]]


@pytest.fixture
async def tuned(tmp_path: Path, database_url: str) -> AsyncIterator[Tuned]:
    made: list[Harness] = []

    async def make(**overrides: Any) -> Harness:
        h = await make_harness(make_settings(tmp_path, database_url, **overrides))
        made.append(h)
        return h

    yield make
    for h in made:
        await h.client.aclose()
        await h.state.db.dispose()


async def _worker_ms(h: Harness, account_id: str) -> int:
    async with h.state.db.read() as session:
        rows = (
            await session.execute(
                select(Task.started_at, Task.finished_at).where(
                    Task.account_id == account_id, Task.finished_at.is_not(None)
                )
            )
        ).all()
    return sum(int(end) - int(start) for start, end in rows if start is not None)


async def test_queue_views_count_waiting_running_weight_and_share(tuned: Tuned) -> None:
    h = await tuned()
    other = await create_account(h.state.db, "other")
    admin = await tuned(admin_accounts=[h.account.account_id])
    await set_account_limits(
        h.state.db, other.account_id, per_second=None, burst=None, in_flight=None
    )
    async with h.state.db.write() as session:
        await session.execute(
            update(AccountLimit).where(AccountLimit.account_id == other.account_id).values(weight=3)
        )
    for _ in range(2):
        assert (await h.submit(body())).status_code == 200
    assert await h.run_all() == 2
    for _ in range(3):
        response = await h.client.post(
            "/api/v1/model/generateImage", json=body(), headers=bearer(other.api_key)
        )
        assert response.status_code == 200
    for _ in range(4):
        assert (await h.submit(body())).status_code == 200
    own = (await h.client.get("/api/v1/queue", headers=h.headers)).json()
    assert own["window_seconds"] == 900
    [mine] = own["accounts"]
    assert (mine["account_id"], mine["weight"], mine["waiting"], mine["running"]) == (
        h.account.account_id,
        1,
        4,
        0,
    )
    # Every worker second so far was this account's; both accounts have work now.
    assert mine["worker_seconds"] == pytest.approx(await _worker_ms(h, mine["account_id"]) / 1000)
    assert mine["usage_share"] == (1.0 if mine["worker_seconds"] else 0.0)
    assert mine["fair_share"] == 0.25
    refused = await h.client.get("/api/v1/admin/queue", headers=h.headers)
    assert refused.status_code == 403
    every = (await admin.client.get("/api/v1/admin/queue", headers=h.headers)).json()
    rows = {a["account_id"]: a for a in every["accounts"]}
    assert [a["account_id"] for a in every["accounts"]] == [h.account.account_id, other.account_id]
    assert (rows[other.account_id]["weight"], rows[other.account_id]["waiting"]) == (3, 3)
    assert rows[other.account_id]["fair_share"] == 0.75
    assert rows[other.account_id]["usage_share"] == 0.0
    # An account with nothing at all still sees its own weight.
    idle = await create_account(h.state.db, "idle")
    alone = (await h.client.get("/api/v1/queue", headers=bearer(idle.api_key))).json()
    assert alone["accounts"] == [
        {
            "account_id": idle.account_id,
            "weight": 1,
            "waiting": 0,
            "running": 0,
            "worker_seconds": 0.0,
            "usage_share": 0.0,
            "fair_share": 0.0,
        }
    ]


def _samples(text: str, name: str) -> dict[str, float]:
    found: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith(name + "{"):
            labels, _, value = line.rpartition(" ")
            found[labels[len(name) + 1 : -1]] = float(value)
    return found


async def test_metrics_show_top_accounts_and_other_only_when_asked(tuned: Tuned) -> None:
    h = await tuned(metrics_accounts=1)
    second = await create_account(h.state.db, "second")
    third = await create_account(h.state.db, "third")
    for key, count in ((h.account.api_key, 3), (second.api_key, 2), (third.api_key, 1)):
        for _ in range(count):
            response = await h.client.post(
                "/api/v1/model/generateImage", json=body(), headers=bearer(key)
            )
            assert response.status_code == 200
    text = (await h.client.get("/metrics")).text
    waiting = _samples(text, "genhook_account_tasks_waiting")
    assert waiting == {f'account="{h.account.account_id}"': 3.0, 'account="other"': 3.0}
    assert set(_samples(text, "genhook_account_weight")) == {f'account="{h.account.account_id}"'}
    off = await tuned()
    plain = (await off.client.get("/metrics")).text
    assert "genhook_account_" not in plain
    assert h.account.account_id not in plain


async def test_metrics_accounts_setting_is_bounded(tmp_path: Path, sqlite_url: str) -> None:
    with pytest.raises(ValueError, match="metrics_accounts"):
        make_settings(tmp_path, sqlite_url, metrics_accounts=-1)


async def test_metrics_stay_up_with_account_gauges_on_an_empty_queue(tuned: Tuned) -> None:
    h = await tuned(metrics_accounts=5)
    text = (await h.client.get("/metrics")).text
    assert "genhook_metrics_database_up 1.0" in text
    assert _samples(text, "genhook_account_tasks_waiting") == {}
