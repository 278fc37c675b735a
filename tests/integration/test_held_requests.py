"""Requests that hold their slot while they wait (``Prefer: wait``, event streams) are
capped per key and per account, with 429 and ``Retry-After``, and leave others room."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from genhook.accounts import create_account, create_key
from tests.conftest import Harness, make_harness, make_settings
from tests.support.images import data_url

WAIT = {"Prefer": "wait=30"}


@pytest.fixture
async def h(tmp_path: Path, sqlite_url: str) -> AsyncIterator[Harness]:
    settings = make_settings(
        tmp_path,
        sqlite_url,
        max_concurrent_requests=8,
        max_held_requests_per_account=3,
        max_held_requests_per_key=2,
    )
    harness = await make_harness(settings)
    yield harness
    await harness.client.aclose()
    await harness.state.db.dispose()


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


async def until_held(h: Harness, count: int) -> None:
    while h.state.held.total < count:
        await asyncio.sleep(0.01)


async def test_held_requests_are_capped_per_key_and_account_and_leave_room(h: Harness) -> None:
    body = {"model": "test/fake-edit", "prompt": "x", "images": [data_url()]}
    task_id = (await h.submit(body)).json()["id"]
    result = f"/api/v1/model/result/{task_id}"
    events = f"{result}/events"
    first_key = h.headers
    second_key = bearer((await create_key(h.state.db, h.account.account_id, "second")).api_key)
    waiting: list[asyncio.Task[httpx.Response]] = []

    def wait_with(headers: dict[str, str], path: str = result) -> None:
        waiting.append(asyncio.create_task(h.client.get(path, headers={**headers, **WAIT})))

    async def task_of(headers: dict[str, str]) -> str:
        submitted = await h.client.post("/api/v1/model/generateImage", json=body, headers=headers)
        return f"/api/v1/model/result/{submitted.json()['id']}"

    wait_with(first_key)
    wait_with(first_key)
    await until_held(h, 2)
    # The key's third: refused, on both kinds of held request, and on a waiting submit.
    for refused in (
        await h.client.get(result, headers={**first_key, **WAIT}),
        await h.client.get(events, headers=first_key),
        await h.client.post(
            "/api/v1/model/generateImage", json=body, headers={**first_key, **WAIT}
        ),
    ):
        assert refused.status_code == 429, refused.text
        assert int(refused.headers["Retry-After"]) >= 1
    # Plain requests of the same key still go through.
    assert (await h.client.get(result, headers=first_key)).status_code == 200
    # Another key of the account has room until the account's cap.
    wait_with(second_key)
    await until_held(h, 3)
    assert (await h.client.get(result, headers={**second_key, **WAIT})).status_code == 429
    # Other accounts are not affected ...
    other = bearer((await create_account(h.state.db, "other")).api_key)
    other_result = await task_of(other)
    wait_with(other, other_result)
    wait_with(other, other_result)
    third = bearer((await create_account(h.state.db, "third")).api_key)
    wait_with(third, await task_of(third))
    await until_held(h, 6)
    # ... until held requests of all accounts together fill their share (6 of 8 slots):
    # then one more is 503, and the rest of the slots still serve plain requests.
    fourth = bearer((await create_account(h.state.db, "fourth")).api_key)
    full = await h.client.post("/api/v1/model/generateImage", json=body, headers={**fourth, **WAIT})
    assert full.status_code == 503, full.text
    assert full.headers["Retry-After"]
    assert (await h.client.get(result, headers=first_key)).status_code == 200
    # The tasks end: every wait is answered and every place given back.
    assert await h.run_all() == 3
    answers = await asyncio.wait_for(asyncio.gather(*waiting), 30)
    assert [answer.json()["status"] for answer in answers] == ["completed"] * 6
    stream = await h.client.get(events, headers=first_key)
    assert stream.status_code == 200
    assert "event: completed" in stream.text
    assert h.state.held.total == 0
