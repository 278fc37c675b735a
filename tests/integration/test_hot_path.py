"""The worker's hot path on SQLite and PostgreSQL: how many SQL statements a task costs from
claim to completion (pinned, so a change that adds one fails here), and the batched lease
keeper's heartbeats and cancel checks."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import event, func, select, update

from genhook.config import Settings
from genhook.db import Blob, Database, Task, UsageLine, WebhookDelivery, driver, now_ms
from genhook.sender.outbox import build_body, event_type_for
from genhook.tasks import Lifecycle
from genhook.tasks.lifecycle import Completion
from genhook.tasks.views import prediction_view
from genhook.tasks.worker.leases import LeaseKeeper
from tests.conftest import QUIET_KEEPER, Harness, make_settings
from tests.support.images import data_url
from tests.support.settled import settled

MODEL = "test/fake-edit"


@pytest.fixture
def settings(tmp_path: Path, database_url: str) -> Settings:
    return make_settings(tmp_path, database_url, **QUIET_KEEPER)


def writes(seen: Counter[str], h: Harness) -> int:
    """The UPDATEs counted in ``seen``: the fair claim is one statement beginning with
    WITH on PostgreSQL, and on SQLite a read beginning with WITH, then an UPDATE."""
    return seen["UPDATE"] + (seen["WITH"] if h.state.db.is_postgres else 0)


@contextmanager
def counting(db: Database) -> Iterator[Counter[str]]:
    """Statements sent through ``db`` by first word, and transactions begun (``"tx"``),
    through a session or on the driver connection (``genhook.db.driver``)."""
    seen: Counter[str] = Counter()

    def on_statement(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        verb = statement.split(None, 1)[0].upper()
        if verb != "BEGIN":  # SQLite's explicit BEGIN; counted as a transaction below
            seen[verb] += 1

    def on_begin(*_: Any) -> None:
        seen["tx"] += 1

    def on_driver_statement(statement: str) -> None:
        on_statement(None, None, statement)

    engines = {id(e): e.sync_engine for e in (db.write_engine, db.read_engine)}.values()
    for engine in engines:
        event.listen(engine, "before_cursor_execute", on_statement)
        event.listen(engine, "begin", on_begin)
    driver.on_statement.append(on_driver_statement)
    driver.on_begin.append(on_begin)
    try:
        yield seen
    finally:
        for engine in engines:
            event.remove(engine, "before_cursor_execute", on_statement)
            event.remove(engine, "begin", on_begin)
        driver.on_statement.remove(on_driver_statement)
        driver.on_begin.remove(on_begin)


async def submit(h: Harness, prompt: str = "edit", **fields: Any) -> str:
    body = {"model": MODEL, "prompt": prompt, "images": [data_url()], "size": "1024*1024"}
    body.update(fields)
    response = await h.submit(body)
    assert response.status_code == 200, response.text
    task_id: str = response.json()["id"]
    return task_id


async def test_one_task_from_claim_to_completion_costs_five_statements(harness: Harness) -> None:
    task_id = await submit(harness)
    with counting(harness.state.db) as seen:
        assert await harness.worker.run_turn()
    # Claim: the fair claim (WITH ... UPDATE ... RETURNING), its input image and whether
    # another task waits, in one transaction. Completion: the conditional UPDATE, the input
    # blob's DELETE, the usage line's INSERT and the account clock's UPDATE, in another.
    assert writes(seen, harness) == 3
    rest = {verb: n for verb, n in seen.items() if verb not in ("UPDATE", "WITH")}
    assert rest == {"tx": 2, "SELECT": 2, "DELETE": 1, "INSERT": 1}
    async with harness.state.db.read() as session:
        task = await session.get(Task, task_id)
        assert task is not None and task.status == "completed" and len(task.outputs) == 1
        usage = await session.scalar(select(func.count()).where(UsageLine.task_id == task_id))
        assert usage == 1
        inputs = [item["blob"] for item in task.inputs]
        assert await session.scalar(select(func.count()).where(Blob.key.in_(inputs))) == 0


async def test_a_claim_tells_whether_another_task_was_waiting(harness: Harness) -> None:
    """A worker that knows nothing else waits needs no second claim (a write) after its task."""
    lifecycle = harness.worker.lifecycle
    first, second = await submit(harness), await submit(harness)
    claim = await lifecycle.claim("w-1", [MODEL])
    assert [task.id for task in claim.tasks] == [first] and claim.more
    claim = await lifecycle.claim("w-1", [MODEL])
    assert [task.id for task in claim.tasks] == [second] and not claim.more
    claim = await lifecycle.claim("w-1", [MODEL])
    assert (claim.tasks, claim.more) == ([], False)


async def test_a_claim_reads_every_input_image_of_its_task(harness: Harness) -> None:
    """Three images in, three read with the claim (one statement for all of them), the next
    task's left alone."""
    colours = [(200, 30, 30), (30, 200, 30), (30, 30, 200)]
    first = await submit(harness, images=[data_url(colour) for colour in colours])
    second = await submit(harness)
    inputs: dict[str, dict[str, bytes]] = {}
    claim = await harness.worker.lifecycle.claim("w-1", [MODEL], inputs=inputs)
    (task,) = claim.tasks
    assert task.id == first and claim.more
    keys = [item["blob"] for item in task.inputs]
    assert list(inputs) == [first] and sorted(inputs[first]) == sorted(keys)
    async with harness.state.db.read() as session:
        stored = {key: data for key, data in await session.execute(select(Blob.key, Blob.data))}
    assert {key: stored[key] for key in keys} == inputs[first]
    claim = await harness.worker.lifecycle.claim("w-1", [MODEL], inputs=inputs)
    assert [task.id for task in claim.tasks] == [second] and not claim.more
    assert len(inputs[second]) == 1


async def test_a_running_worker_claims_nothing_after_its_last_task(harness: Harness) -> None:
    """After the last task the worker waits; it does not write an empty claim first."""
    worker, db = harness.worker, harness.state.db
    # Only the submit's wake-up starts it: a poll that finds the task first would leave that
    # wake-up pending, and a pending wake-up is worth a claim.
    worker.settings = worker.settings.model_copy(update={"worker_poll_seconds": 5.0})
    stop = asyncio.Event()
    with counting(db) as seen:
        running = asyncio.create_task(worker.run(stop))
        try:
            async with asyncio.timeout(30):
                while not seen["WITH"]:  # its first claim, on an empty queue
                    await asyncio.sleep(0.01)
            await settled(worker)
            seen.clear()
            task_id = await submit(harness)
            async with asyncio.timeout(30):
                while (await harness.result(task_id))["status"] != "completed":
                    await asyncio.sleep(0.01)
            await asyncio.sleep(0.3)  # time enough for the empty claim this test rules out
        finally:
            stop.set()
            await running
    # One claim (the fair claim begins with WITH), the completion and the account's charge.
    assert seen["WITH"] == 1
    assert writes(seen, harness) == 3


async def test_a_batch_costs_one_statement_per_task_beyond_its_shared_ones(
    harness: Harness,
) -> None:
    ids = [await submit(harness) for _ in range(4)]
    lifecycle = Lifecycle(harness.state.settings, harness.state.db, harness.state.storage)
    inputs: dict[str, dict[str, bytes]] = {}
    with counting(harness.state.db) as claim:
        tasks = (await lifecycle.claim("w-batch", [MODEL], limits={MODEL: 8}, inputs=inputs)).tasks
    assert sorted(task.id for task in tasks) == sorted(ids)
    assert sorted(inputs) == sorted(ids) and all(len(images) == 1 for images in inputs.values())
    # The ids, the UPDATE that takes them, and their input images: one transaction.
    assert dict(claim) == {"tx": 1, "SELECT": 2, "UPDATE": 1}
    items = [Completion(task_id, [], [], {"n": 1}) for task_id in ids]
    items.append(Completion("no-such-task", [], [], {}))
    with counting(harness.state.db) as complete:
        done = await lifecycle.complete_many("w-batch", items)
    assert done == [True, True, True, True, False]
    # One UPDATE per task, one DELETE of every input blob, one INSERT of every usage line,
    # one UPDATE of their account's clock.
    assert dict(complete) == {"tx": 1, "UPDATE": 6, "DELETE": 1, "INSERT": 1}
    async with harness.state.db.read() as session:
        rows = (await session.execute(select(Task.status, Task.info).where(Task.id.in_(ids)))).all()
        assert [tuple(r) for r in rows] == [("completed", {"n": 1})] * 4
        usage = await session.scalar(select(func.count()).where(UsageLine.task_id.in_(ids)))
        assert usage == 4


async def test_a_task_held_by_another_worker_is_not_completed(harness: Harness) -> None:
    task_id = await submit(harness)
    lifecycle = Lifecycle(harness.state.settings, harness.state.db, harness.state.storage)
    assert (await lifecycle.claim("w-owner", [MODEL])).tasks
    assert not await lifecycle.complete(task_id, "w-other", outputs=[], nsfw=[], info={})
    assert await lifecycle.complete(task_id, "w-owner", outputs=[], nsfw=[], info={})
    async with harness.state.db.read() as session:
        usage = await session.scalar(select(func.count()).where(UsageLine.task_id == task_id))
    assert usage == 1


async def test_keeper_extends_held_leases_and_reports_a_cancel(harness: Harness) -> None:
    kept_id, canceled_id = await submit(harness), await submit(harness)
    lifecycle = Lifecycle(harness.state.settings, harness.state.db, harness.state.storage)
    assert len((await lifecycle.claim("w-keep", [MODEL], limits={MODEL: 2})).tasks) == 2
    async with harness.state.db.read() as session:
        before = await session.scalar(select(Task.lease_expires_at).where(Task.id == kept_id))
    keeper = LeaseKeeper(lifecycle, "w-keep", heartbeat_seconds=0.3, check_seconds=0.1)
    kept, canceled = asyncio.Event(), asyncio.Event()
    keeper.hold(kept_id, kept)
    keeper.hold(canceled_id, canceled)
    try:
        response = await harness.client.post(
            f"/api/v1/model/result/{canceled_id}/cancel", headers=harness.headers
        )
        assert response.status_code == 200, response.text
        await asyncio.wait_for(canceled.wait(), 5)  # noticed by a check, not a heartbeat
        await asyncio.sleep(0.5)  # at least one heartbeat
    finally:
        keeper.drop(kept_id)
        keeper.drop(canceled_id)
    assert not kept.is_set()
    async with harness.state.db.read() as session:
        after = await session.scalar(select(Task.lease_expires_at).where(Task.id == kept_id))
    assert before is not None and after is not None and after > before


async def test_a_callback_rendered_from_the_completion_row_is_the_one_polling_shows(
    harness: Harness,
) -> None:
    """The completion renders each webhook body from the row its UPDATE returns; it is byte
    for byte the body rendered from the task as stored, read back after the commit."""
    hook = "http://127.0.0.1:9/hook?tenant=t%C3%A9"
    plain = await submit(harness, "façade ✓", webhook_url=hook)
    transcribed = await submit(harness, webhook_url=hook, webhook_events=["processing", "terminal"])
    base64_out = await submit(harness, webhook_url=hook, enable_base64_output=True)
    lifecycle, state = harness.worker.lifecycle, harness.state
    assert len((await lifecycle.claim("w-hook", [MODEL], limits={MODEL: 8})).tasks) == 3
    key = "outputs/row-check.png"
    await state.storage.put(key, b"\x89PNG-not-really", "image/png")
    items = [
        Completion(plain, [key, key], [False, True], {"plan": [{"op": "grayscale"}], "n": "é"}),
        Completion(transcribed, [key], [False], {}, 1234, {"text": "héllo", "words": []}),
        Completion(base64_out, [key], [True], {"plan": []}),
    ]
    assert await lifecycle.complete_many("w-hook", items) == [True, True, True]
    async with state.db.read() as session:
        for task_id in (plain, transcribed, base64_out):
            task = await session.get(Task, task_id)
            assert task is not None and task.status == "completed"
            event_type = event_type_for(task.kind)
            sent = await session.scalar(
                select(WebhookDelivery.body).where(
                    WebhookDelivery.task_id == task_id, WebhookDelivery.event_type == event_type
                )
            )
            view = await prediction_view(task, state.settings, state.storage, for_webhook=True)
            assert sent is not None and bytes(sent) == build_body(task, event_type, view)
        # The transcribed task's opt-in processing event was superseded by its terminal one.
        progress = await session.scalar(
            select(WebhookDelivery.status).where(
                WebhookDelivery.task_id == transcribed,
                WebhookDelivery.event_type.like("%.task.processing"),
            )
        )
        assert progress == "undeliverable"


async def test_a_completion_gives_up_only_progress_events_not_in_flight(harness: Harness) -> None:
    """A task's pending processing event gives way to its terminal one unless an attempt of it
    is on the wire (its lease runs); a task claimed again keeps its one processing event."""
    hook, events = "http://127.0.0.1:9/hook", ["processing", "terminal"]
    idle = await submit(harness, webhook_url=hook, webhook_events=events)
    lapsed = await submit(harness, webhook_url=hook, webhook_events=events)
    in_flight = await submit(harness, webhook_url=hook, webhook_events=events)
    lifecycle, db = harness.worker.lifecycle, harness.state.db
    assert len((await lifecycle.claim("w-progress", [MODEL], limits={MODEL: 8})).tasks) == 3
    assert await lifecycle.release(idle, "w-progress")
    assert (await lifecycle.claim("w-progress", [MODEL])).tasks  # ``idle`` again
    now = now_ms()
    progress = WebhookDelivery.event_type.like("%.task.processing")
    async with db.write() as session:
        for task_id, lease in ((lapsed, now - 1000), (in_flight, now + 60_000)):
            await session.execute(
                update(WebhookDelivery)
                .where(WebhookDelivery.task_id == task_id, progress)
                .values(lease_owner="d-1", lease_expires_at=lease)
            )
    items = [Completion(task_id, [], [], {}) for task_id in (idle, lapsed, in_flight)]
    assert await lifecycle.complete_many("w-progress", items) == [True, True, True]
    async with db.read() as session:
        rows = (
            await session.execute(
                select(WebhookDelivery.task_id, WebhookDelivery.status, WebhookDelivery.last_error)
                .where(progress)
                .order_by(WebhookDelivery.created_at)
            )
        ).all()
    states = {task_id: (status, error) for task_id, status, error in rows}
    assert len(rows) == 3
    assert states[idle] == ("undeliverable", "superseded by the terminal event")
    assert states[lapsed] == ("undeliverable", "superseded by the terminal event")
    assert states[in_flight] == ("pending", None)
