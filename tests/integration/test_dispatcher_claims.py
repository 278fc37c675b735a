"""What an idle dispatcher's claim carries: on PostgreSQL a claim that wakes it goes alone, one
statement outside a transaction, and the outcomes it holds go with a later exchange; on
SQLite they go with the claim. An outcome that holds back another event of its task always
goes with the claim."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import pytest
from sqlalchemy import select

from genhook.config import Settings
from genhook.db import Database, WebhookDelivery, now_ms, wakeups
from genhook.db.driver import PostgresTx
from genhook.sender import dispatcher as dispatcher_module
from genhook.sender.dispatcher import Dispatcher
from genhook.sender.events import enqueue_processing
from genhook.sender.feed import LocalFeed
from genhook.sender.keys import KeyRing
from genhook.sender.outbox import enqueue_delivery
from genhook.sender.queue import DeliveryQueue, Outcome, Ticked, delivery_queue
from genhook.wiring import webhook_service
from tests.support.webhook_receiver import (
    FeedWrapper,
    Receiver,
    add_account,
    create_schema,
    delivery_database,
    enqueue,
    payload_for,
    status,
    terminal_task,
    webhook_settings,
)


class ExchangeLog(FeedWrapper):
    """The dispatcher's feed, noting each exchange: (outcomes handed in, their delivery ids,
    deliveries asked for, deliveries claimed)."""

    def __init__(self, feed: LocalFeed, dispatcher: Dispatcher) -> None:
        super().__init__(feed)
        self.dispatcher = dispatcher
        self.exchanges: list[tuple[int, list[str], int, list[str]]] = []

    async def outcome_in_hand(self) -> None:
        """Until the dispatcher holds an attempt's outcome, not yet recorded."""
        async with asyncio.timeout(20):
            while not self.dispatcher._outcomes:
                await asyncio.sleep(0.005)

    def after(self, outcomes: Sequence[Outcome], limit: int, ticked: Ticked) -> None:
        ids = [outcome.delivery_id for outcome in outcomes]
        claimed = [attempt.id for attempt in ticked.claimed]
        self.exchanges.append((len(outcomes), ids, limit, claimed))


@pytest.fixture
async def env(
    tmp_path: Path, database_url: str, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[tuple[Settings, Database]]:
    # Outcomes wait long enough for company that the next claim surely comes first.
    monkeypatch.setattr(dispatcher_module, "RECORD_DELAY_SECONDS", 3.0)
    settings = webhook_settings(tmp_path, database_url, webhook_poll_seconds=3600.0)
    db = await delivery_database(settings)
    yield settings, db
    await db.dispose()


@contextlib.asynccontextmanager
async def running(settings: Settings, db: Database) -> AsyncIterator[ExchangeLog]:
    """A dispatcher woken by deliveries enqueued (as the service runs it), with its feed's
    exchanges noted; stopped on the way out."""
    dispatcher = Dispatcher(
        settings, db, policy=webhook_service(settings, db).policy, keyring=KeyRing(db, settings)
    )
    log = ExchangeLog(dispatcher.feed, dispatcher)
    dispatcher.feed = log  # type: ignore[assignment]
    wake = wakeups.subscribe(db.url, wakeups.DELIVERIES, dispatcher.wake)
    stop = asyncio.Event()
    run = asyncio.create_task(dispatcher.run(stop))
    try:
        yield log
    finally:
        stop.set()
        await run
        wake.close()


async def wait_for(receiver: Receiver, count: int) -> None:
    async with asyncio.timeout(20):
        while len(receiver.received) < count:
            await asyncio.sleep(0.01)


async def delivery_ids(db: Database) -> list[str]:
    async with db.read() as session:
        return list(await session.scalars(select(WebhookDelivery.id)))


async def wait_delivered(db: Database, ids: Sequence[str]) -> None:
    async with asyncio.timeout(20):
        while True:
            async with db.read() as session:
                rows = await session.scalars(
                    select(WebhookDelivery.status).where(WebhookDelivery.id.in_(ids))
                )
                if list(rows) == ["delivered"] * len(ids):
                    return
            await asyncio.sleep(0.02)


async def test_a_claim_that_wakes_an_idle_dispatcher(env: tuple[Settings, Database]) -> None:
    """The second delivery's claim comes while the first one's outcome waits for company:
    on PostgreSQL it goes alone and the outcome follows; on SQLite it carries the outcome."""
    settings, db = env
    receiver = await Receiver(status(200)).start()
    url = f"http://127.0.0.1:{receiver.port}/hook"
    try:
        async with running(settings, db) as log:
            first = await enqueue(db, terminal_task("t1", url))
            await wait_for(receiver, 1)
            await log.outcome_in_hand()  # recorded only after RECORD_DELAY_SECONDS
            second = await enqueue(db, terminal_task("t2", url))
            await wait_for(receiver, 2)
            await wait_delivered(db, [first, second])
    finally:
        await receiver.stop()
    (claim,) = [entry for entry in log.exchanges if entry[3] == [second]]
    if db.is_postgres:
        assert claim[:2] == (0, [])
        # Every claim went alone; both outcomes were handed in by exchanges of their own.
        assert all(not entry[0] for entry in log.exchanges if entry[2])
        recorded = [delivery for entry in log.exchanges for delivery in entry[1]]
        assert sorted(recorded) == sorted([first, second])
    else:
        assert claim[:2] == (1, [first])


async def test_an_outcome_holding_back_its_tasks_terminal_event_goes_with_the_claim(
    env: tuple[Settings, Database],
) -> None:
    """A processing event's lease holds back its task's terminal event until its outcome is
    recorded: that outcome goes with the claim, which then takes the terminal event."""
    settings, db = env
    receiver = await Receiver(status(200)).start()
    url = f"http://127.0.0.1:{receiver.port}/hook"
    task = terminal_task("t1", url, status="processing")
    task.webhook_events = "processing"
    try:
        async with running(settings, db) as log:
            async with db.write() as session:
                session.add(task)
            async with db.transaction() as tx:
                await enqueue_processing(tx, task, now_ms())
            (progress,) = await delivery_ids(db)
            await wait_for(receiver, 1)
            await log.outcome_in_hand()
            task.status = "completed"
            async with db.write() as session:
                await session.merge(task)
                terminal = await enqueue_delivery(
                    session,
                    task=task,
                    event_type="image.task.terminal",
                    payload=payload_for(task),
                    now=now_ms(),
                )
            await wait_for(receiver, 2)
            await wait_delivered(db, [progress, terminal])
    finally:
        await receiver.stop()
    assert (1, [progress]) in [entry[:2] for entry in log.exchanges if entry[3] == [terminal]]


@pytest.mark.postgres
async def test_a_claim_alone_is_one_statement_outside_a_transaction(
    pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    db = Database(pg_url)
    queue: DeliveryQueue = delivery_queue(db)
    begun: list[int] = []
    begin = PostgresTx.begin

    async def counted(self: PostgresTx) -> None:
        begun.append(1)
        await begin(self)

    monkeypatch.setattr(PostgresTx, "begin", counted)
    try:
        await create_schema(db)
        await add_account(db)
        ids = [await enqueue(db, terminal_task(f"t{i}", "http://127.0.0.1/")) for i in range(3)]
        now = now_ms()
        until = now + 40_000
        ticked = await queue.tick(
            [], owner="owner-a", now=now, lease_expires_at=until, limit=2, inline=True
        )
        assert begun == [] and not ticked.next_due_read
        assert len(ticked.claimed) == 2 and {attempt.id for attempt in ticked.claimed} < set(ids)
        async with db.read() as session:  # committed: another connection sees the leases
            owners = list(await session.scalars(select(WebhookDelivery.lease_owner)))
        assert sorted(owner for owner in owners if owner) == ["owner-a", "owner-a"]
        # Not idle (or with outcomes to record): one transaction, as before.
        ticked = await queue.tick([], owner="owner-a", now=now, lease_expires_at=until, limit=2)
        assert begun == [1] and ticked.next_due_read and len(ticked.claimed) == 1
    finally:
        await queue.close()
        await db.dispose()
