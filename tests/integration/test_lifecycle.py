"""The task lifecycle on SQLite and PostgreSQL: claims, leases, deadlines, outcomes, billing."""

from __future__ import annotations

import asyncio
import base64
import io
from decimal import Decimal
from typing import Any

import pytest
from aiohttp import web
from PIL import Image
from sqlalchemy import select, update

from genhook.db import Task, UsageLine, now_ms
from genhook.errors import ErrorCode
from genhook.tasks import Lifecycle, Worker
from tests.conftest import Harness
from tests.support.images import data_url, image_bytes

MODEL = "test/fake-edit"


def body(**fields: Any) -> dict[str, Any]:
    base: dict[str, Any] = {"model": MODEL, "prompt": "edit", "images": [data_url()]}
    base.update(fields)
    return base


async def submit(h: Harness, **fields: Any) -> str:
    response = await h.submit(body(**fields))
    assert response.status_code == 200, response.text
    task_id: str = response.json()["id"]
    return task_id


async def row(h: Harness, task_id: str) -> Task:
    async with h.state.db.read() as session:
        task = await session.get(Task, task_id)
    assert task is not None
    return task


async def test_completed_task_has_served_outputs(harness: Harness) -> None:
    task_id = await submit(harness, size="1024*1024", output_format="png")
    assert await harness.run_all() == 1
    result = await harness.result(task_id)
    assert result["status"] == "completed"
    assert result["has_nsfw_contents"] == [False]
    assert result["completed_at"].endswith("Z")
    (url,) = result["outputs"]
    assert url.startswith("http://testserver/api/v1/outputs/outputs/")
    download = await harness.client.get(url.removeprefix("http://testserver"))
    assert download.status_code == 200
    assert download.headers["content-type"] == "image/png"
    with Image.open(io.BytesIO(download.content)) as img:
        assert img.size == (1024, 1024)
        assert img.getpixel((5, 5))[:3] == (200, 30, 30)
    assert (await harness.client.get("/api/v1/outputs/outputs/guess.png")).status_code == 404
    assert (await harness.client.get("/api/v1/outputs/inputs/x/0")).status_code == 404


async def test_base64_output(harness: Harness) -> None:
    task_id = await submit(harness, size="1024*1024", enable_base64_output=True)
    await harness.run_all()
    (encoded,) = (await harness.result(task_id))["outputs"]
    with Image.open(io.BytesIO(base64.b64decode(encoded))) as img:
        assert img.format == "JPEG" and img.size == (1024, 1024)


async def test_engine_failure_and_crash(harness: Harness) -> None:
    failed = await submit(harness, prompt="please fail")
    crashed = await submit(harness, prompt="crash now")
    nsfw = await submit(harness, prompt="nsfw", size="1024*1024")
    await harness.run_all()
    result = await harness.result(failed)
    assert result["status"] == "failed"
    assert result["error_code"] == ErrorCode.INSTRUCTION_INVALID
    assert result["error"] == "the prompt asked to fail"
    assert result["outputs"] == []
    result = await harness.result(crashed)
    assert result["error_code"] == ErrorCode.ENGINE_ERROR
    assert "unexpected engine bug" not in result["error"]
    assert (await harness.result(nsfw))["has_nsfw_contents"] == [True]


async def test_usage_lines_for_multi_image_task(harness: Harness) -> None:
    three = await submit(harness, images=[data_url()] * 3, size="2048*2048")
    one = await submit(harness, size="1536*1536")
    failed = await submit(harness, prompt="fail", images=[data_url()] * 4)
    await harness.run_all()
    usage = (await harness.client.get("/api/v1/usage", headers=harness.headers)).json()
    assert usage["task_count"] == 2
    items = {item["task_id"]: item for item in usage["items"]}
    assert failed not in items
    assert items[three]["tier"] == "2K" and items[three]["input_images"] == 3
    assert Decimal(items[three]["amount_usd"]) == Decimal("0.030") + 2 * Decimal("0.003")
    assert items[three]["lines"][1] == ["2 additional input image(s)", "0.006"]
    assert items[one]["tier"] == "1.5K" and Decimal(items[one]["amount_usd"]) == Decimal("0.027")
    assert Decimal(usage["total_usd"]) == Decimal("0.063")
    async with harness.state.db.read() as session:
        micros = (await session.scalars(select(UsageLine.amount_micros))).all()
    assert sorted(micros) == [27_000, 36_000]
    page = (await harness.client.get("/api/v1/usage?limit=1", headers=harness.headers)).json()
    assert len(page["items"]) == 1 and page["next_cursor"]
    rest = await harness.client.get(
        f"/api/v1/usage?limit=1&cursor={page['next_cursor']}", headers=harness.headers
    )
    assert rest.json()["items"][0]["task_id"] != page["items"][0]["task_id"]


async def test_two_workers_never_claim_the_same_task(harness: Harness) -> None:
    ids = {await submit(harness) for _ in range(12)}
    lifecycle = Lifecycle(harness.state.settings, harness.state.db, harness.state.storage)

    async def claimer(name: str) -> list[str]:
        got = []
        while tasks := (await lifecycle.claim(name, [MODEL])).tasks:
            got.extend(task.id for task in tasks)
        return got

    results = await asyncio.gather(*(claimer(f"w{i}") for i in range(4)))
    claimed = [task_id for got in results for task_id in got]
    assert sorted(claimed) == sorted(ids)


async def test_terminal_state_is_final(harness: Harness) -> None:
    task_id = await submit(harness)
    lifecycle = Lifecycle(harness.state.settings, harness.state.db, harness.state.storage)
    (task,) = (await lifecycle.claim("w1", [MODEL])).tasks
    assert task.status == "processing"
    assert await lifecycle.fail(task_id, "w1", ErrorCode.ENGINE_ERROR, "x")
    assert not await lifecycle.complete(task_id, "w1", outputs=["o"], nsfw=[False], info={})
    assert not await lifecycle.time_out(task_id)
    assert not await lifecycle.heartbeat(task_id, "w1")
    assert (await row(harness, task_id)).status == "failed"


async def test_lost_lease_requeues_then_fails(harness: Harness) -> None:
    harness.state.settings.max_lease_losses = 2
    task_id = await submit(harness)
    lifecycle = Lifecycle(harness.state.settings, harness.state.db, harness.state.storage)

    async def expire() -> None:
        async with harness.state.db.write() as session:
            await session.execute(
                update(Task).where(Task.id == task_id).values(lease_expires_at=now_ms() - 1)
            )

    assert (await lifecycle.claim("dead-1", [MODEL])).tasks
    await expire()
    assert await lifecycle.sweep() == 1
    task = await row(harness, task_id)
    assert task.status == "created" and task.lease_losses == 1 and task.lease_owner is None
    # The first worker is gone: its late heartbeat and completion must not count.
    assert not await lifecycle.heartbeat(task_id, "dead-1")
    assert (await lifecycle.claim("dead-2", [MODEL])).tasks
    await expire()
    await lifecycle.sweep()
    result = await harness.result(task_id)
    assert result["status"] == "failed"
    assert result["error_code"] == ErrorCode.WORKER_LOST


async def test_deadline_times_out_queued_and_running_tasks(harness: Harness) -> None:
    queued = await submit(harness)
    running = await submit(harness, prompt="sleep=2.5")
    lifecycle = Lifecycle(harness.state.settings, harness.state.db, harness.state.storage)
    async with harness.state.db.write() as session:
        await session.execute(
            update(Task).where(Task.id == queued).values(deadline_at=now_ms() - 1)
        )
        await session.execute(
            update(Task).where(Task.id == running).values(deadline_at=now_ms() + 1500)
        )
    await lifecycle.sweep()
    result = await harness.result(queued)
    assert result["status"] == "failed"  # polling shows timeout as failed, with its own code
    assert result["error_code"] == ErrorCode.TIMEOUT
    assert (await row(harness, queued)).status == "timeout"
    # The worker stops waiting for the engine at the deadline and records the timeout.
    assert await harness.worker.run_turn()
    assert (await row(harness, running)).status == "timeout"
    assert (await harness.result(running))["error_code"] == ErrorCode.TIMEOUT
    # Its engine thread is still computing, so the worker stops claiming to be replaced.
    assert harness.worker.tainted
    await asyncio.wait_for(harness.worker.run(asyncio.Event()), 5)  # returns without claiming


async def run_until_processing_then_stop(h: Harness, task_id: str) -> None:
    """Run the worker loop, and ask it to stop once it holds ``task_id``."""
    stop = asyncio.Event()
    run = asyncio.create_task(h.worker.run(stop))
    for _ in range(200):
        if (await row(h, task_id)).status == "processing":
            break
        await asyncio.sleep(0.02)
    stop.set()
    await asyncio.wait_for(run, 10)


async def test_graceful_stop_releases_task_after_grace(harness: Harness) -> None:
    harness.state.settings.shutdown_grace_seconds = 0.2
    task_id = await submit(harness, prompt="sleep=3")
    await run_until_processing_then_stop(harness, task_id)
    task = await row(harness, task_id)
    assert task.status == "created" and task.lease_losses == 0 and task.lease_owner is None


async def test_graceful_stop_finishes_short_task(harness: Harness) -> None:
    task_id = await submit(harness, prompt="sleep=0.5")
    await run_until_processing_then_stop(harness, task_id)
    assert (await row(harness, task_id)).status == "completed"


@pytest.fixture
async def image_server() -> Any:
    async def ok(_: web.Request) -> web.Response:
        return web.Response(body=image_bytes((10, 200, 10)), content_type="image/png")

    async def big(_: web.Request) -> web.Response:
        return web.Response(body=b"\x89PNG" + b"0" * 3_000_000, content_type="image/png")

    app = web.Application()
    app.router.add_get("/ok.png", ok)
    app.router.add_get("/big.png", big)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    yield f"http://127.0.0.1:{port}"
    await runner.cleanup()


async def test_input_urls_are_fetched(harness: Harness, image_server: str) -> None:
    harness.state.settings.input_max_bytes = 1_000_000
    good = await submit(harness, images=[f"{image_server}/ok.png", data_url((10, 10, 10))])
    missing = await submit(harness, images=[data_url(), f"{image_server}/missing.png"])
    big = await submit(harness, images=[f"{image_server}/big.png"])
    await harness.run_all()
    assert (await harness.result(good))["status"] == "completed"
    result = await harness.result(missing)
    assert result["error_code"] == ErrorCode.INPUT_FETCH_FAILED
    assert result["error"].startswith("images[1]: ")
    assert (await harness.result(big))["error_code"] == ErrorCode.INPUT_TOO_LARGE


async def test_private_input_urls_refused_by_policy(harness: Harness) -> None:
    from genhook.net import AddressPolicy

    harness.worker.policy = AddressPolicy(allow_private=False)
    task_id = await submit(harness, images=["http://127.0.0.1:9/a.png"])
    await harness.run_all()
    result = await harness.result(task_id)
    assert result["error_code"] == ErrorCode.INPUT_ADDRESS_REFUSED


async def test_engine_loaded_once_per_worker(harness: Harness) -> None:
    from tests.support.engines import FakeEditEngine

    before = FakeEditEngine.loads
    for _ in range(3):
        await submit(harness)
    worker = Worker.sharing(harness.state, worker_id="w-once")
    while await worker.run_turn():
        pass
    assert FakeEditEngine.loads == before + 1


async def test_input_images_live_with_the_task_until_it_ends(harness: Harness) -> None:
    from genhook.db import Blob

    async def input_blobs() -> list[str]:
        async with harness.state.db.read() as session:
            keys = await session.scalars(select(Blob.key).where(Blob.key.startswith("inputs/")))
            return sorted(keys)

    done = await submit(harness, images=[data_url(), data_url((1, 2, 3), "JPEG")])
    failed = await submit(harness, prompt="fail")
    assert await input_blobs() == sorted(
        [f"inputs/{done}_0.png", f"inputs/{done}_1.jpeg", f"inputs/{failed}_0.png"]
    )
    await harness.run_all()
    assert await input_blobs() == []
    assert (await harness.result(done))["status"] == "completed"
