"""The delivery queue adapters (SQLite and PostgreSQL): claim, record, leases, exact bytes."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import insert, select, update

from genhook.db import Database, Task, WebhookAttempt, WebhookDelivery, now_ms
from genhook.sender.queue import DeliveryQueue, Outcome, Outgoing, Ticked, delivery_queue
from tests.support.postgres import PostgresServer
from tests.support.webhook_receiver import add_account, create_schema, terminal_task

# Bytes a JSON-in-SQL round trip could corrupt: NUL, invalid UTF-8, quotes, non-ASCII.
ODD_BODY = b'{"x":"\x00\xff\xfe \\" \xe2\x82\xac"}'


@pytest.fixture
async def db(database_url: str) -> AsyncIterator[Database]:
    database = Database(database_url)
    await create_schema(database)
    await add_account(database, "acct_1", "whsec_one")
    await add_account(database, "acct_2", "whsec_two")
    yield database
    await database.dispose()


@pytest.fixture
async def queue(db: Database) -> AsyncIterator[DeliveryQueue]:
    adapter = delivery_queue(db)
    yield adapter
    await adapter.close()


async def add_deliveries(db: Database, count: int, *, due_at: int = 0) -> list[str]:
    now = now_ms()
    ids = [f"whd_{i:03d}" for i in range(count)]
    async with db.write() as session:
        for i in range(count):
            account = "acct_1" if i % 2 == 0 else "acct_2"
            session.add(terminal_task(f"t_{i:03d}", "http://127.0.0.1/", account_id=account))
        await session.flush()
        await session.execute(
            insert(WebhookDelivery),
            [
                {
                    "id": delivery_id,
                    "task_id": f"t_{i:03d}",
                    "account_id": "acct_1" if i % 2 == 0 else "acct_2",
                    "url": "http://127.0.0.1/",
                    "event_type": "image.task.terminal",
                    "body": ODD_BODY + str(i).encode(),
                    "status": "pending",
                    "attempts": 0,
                    "round_start": 0,
                    "redeliveries": 0,
                    "next_attempt_at": due_at + i,
                    "created_at": now,
                    "updated_at": now,
                }
                for i, delivery_id in enumerate(ids)
            ],
        )
    return ids


def recorded(item: Outgoing, *, status: str = "delivered", now: int = 0) -> Outcome:
    return Outcome(
        delivery_id=item.id,
        attempts=item.attempts,
        round_start=item.round_start,
        started_at=now,
        duration_ms=3,
        status_code=200 if status == "delivered" else 500,
        error=None if status == "delivered" else "HTTP 500 \u20ac",
        excerpt="ok \u20ac",
        kid="kid_1",
        status=status,
        next_attempt_at=None if status == "delivered" else now + 10_000,
        delivered_at=now if status == "delivered" else None,
    )


async def tick(
    queue: DeliveryQueue,
    records: list[Outcome],
    limit: int,
    *,
    owner: str = "owner-a",
    lease_ms: int = 40_000,
) -> list[Outgoing]:
    now = now_ms()
    ticked = await queue.tick(
        records, owner=owner, now=now, lease_expires_at=now + lease_ms, limit=limit
    )
    return ticked.claimed


async def test_claims_due_rows_in_order_with_exact_bodies_and_secrets(
    db: Database, queue: DeliveryQueue
) -> None:
    await add_deliveries(db, 5)
    claimed = await tick(queue, [], 3)
    assert sorted(c.id for c in claimed) == ["whd_000", "whd_001", "whd_002"]
    by_id = {c.id: c for c in claimed}
    assert by_id["whd_001"].body == ODD_BODY + b"1"
    assert by_id["whd_000"].secret == "whsec_one" and by_id["whd_001"].secret == "whsec_two"
    assert by_id["whd_002"].task_id == "t_002" and by_id["whd_002"].attempts == 0
    # Leased rows are not claimed again; the rest are.
    again = await tick(queue, [], 10)
    assert sorted(c.id for c in again) == ["whd_003", "whd_004"]
    assert await tick(queue, [], 10) == []


async def test_not_yet_due_rows_stay(db: Database, queue: DeliveryQueue) -> None:
    await add_deliveries(db, 2, due_at=now_ms() + 60_000)
    assert await tick(queue, [], 10) == []


async def test_records_attempts_and_states_and_claims_in_one_tick(
    db: Database, queue: DeliveryQueue
) -> None:
    await add_deliveries(db, 4)
    first = await tick(queue, [], 2)
    now = now_ms()
    ok, failed = sorted(first, key=lambda c: c.id)
    more = await tick(
        queue, [recorded(ok, now=now), recorded(failed, status="pending", now=now)], 2
    )
    assert sorted(c.id for c in more) == ["whd_002", "whd_003"]
    async with db.read() as session:
        rows = {
            r.id: r
            for r in (
                await session.scalars(
                    select(WebhookDelivery).where(WebhookDelivery.id.in_([ok.id, failed.id]))
                )
            ).all()
        }
        attempts = (await session.scalars(select(WebhookAttempt))).all()
    assert rows[ok.id].status == "delivered" and rows[ok.id].delivered_at == now
    assert rows[ok.id].lease_owner is None and rows[ok.id].attempts == 1
    assert rows[failed.id].status == "pending" and rows[failed.id].next_attempt_at == now + 10_000
    assert (
        rows[failed.id].last_error == "HTTP 500 \u20ac" and rows[failed.id].last_status_code == 500
    )
    assert sorted((a.delivery_id, a.number, a.status_code) for a in attempts) == [
        (ok.id, 1, 200),
        (failed.id, 1, 500),
    ]
    assert {a.response_excerpt for a in attempts} == {"ok \u20ac"}


async def test_an_outcome_whose_lease_was_lost_is_discarded(
    db: Database, queue: DeliveryQueue
) -> None:
    await add_deliveries(db, 1)
    (mine,) = await tick(queue, [], 1, owner="owner-a")
    # The lease expires and another sender claims the delivery.
    async with db.write() as session:
        await session.execute(update(WebhookDelivery).values(next_attempt_at=0, lease_expires_at=0))
    (theirs,) = await tick(queue, [], 1, owner="owner-b")
    assert theirs.id == mine.id
    await tick(queue, [recorded(mine)], 0, owner="owner-a")
    async with db.read() as session:
        row = await session.get(WebhookDelivery, mine.id)
        attempts = (await session.scalars(select(WebhookAttempt))).all()
    assert row is not None and row.status == "pending" and row.lease_owner == "owner-b"
    assert attempts == []
    await tick(queue, [recorded(theirs)], 0, owner="owner-b")
    async with db.read() as session:
        row = await session.get(WebhookDelivery, mine.id)
    assert row is not None and row.status == "delivered"


async def test_two_claims_in_the_same_millisecond_stay_apart(
    db: Database, queue: DeliveryQueue
) -> None:
    await add_deliveries(db, 4)
    now = now_ms()
    first = (await queue.tick([], owner="o", now=now, lease_expires_at=now + 1000, limit=2)).claimed
    second = (
        await queue.tick([], owner="o", now=now, lease_expires_at=now + 1000, limit=2)
    ).claimed
    assert len(first) == len(second) == 2
    assert not {c.id for c in first} & {c.id for c in second}


async def test_sqlite_queue_needs_a_file(tmp_path: Path) -> None:
    db = Database("sqlite+aiosqlite:///:memory:")
    try:
        with pytest.raises(ValueError, match="database file"):
            delivery_queue(db)
    finally:
        await db.dispose()


async def test_task_rows_untouched(db: Database, queue: DeliveryQueue) -> None:
    """The queue writes deliveries and attempts only."""
    await add_deliveries(db, 1)
    (item,) = await tick(queue, [], 1)
    await tick(queue, [recorded(item)], 0)
    async with db.read() as session:
        task = await session.get(Task, "t_000")
    assert task is not None and task.status == "completed"


@pytest.mark.parametrize("inline", [True, False])
async def test_an_idle_callers_tick_runs_on_its_own_thread(
    db: Database, queue: DeliveryQueue, inline: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An idle dispatcher's tick skips the hop to the queue's thread and back; a busy one's
    overlaps with its sends there. Either way the same rows are claimed and recorded."""
    import threading

    from genhook.sender.queue import SQLiteDeliveryQueue

    if not isinstance(queue, SQLiteDeliveryQueue):
        pytest.skip("the PostgreSQL queue has no thread of its own")
    threads: list[int] = []
    run = queue._tick

    def watched(*args: object) -> Ticked:
        threads.append(threading.get_ident())
        return run(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(queue, "_tick", watched)
    await add_deliveries(db, 2)
    now = now_ms()
    ticked = await queue.tick(
        [], owner="owner-a", now=now, lease_expires_at=now + 40_000, limit=5, inline=inline
    )
    claimed = ticked.claimed
    assert sorted(c.id for c in claimed) == ["whd_000", "whd_001"]
    await queue.tick(
        [recorded(c, now=now) for c in claimed],
        owner="owner-a",
        now=now,
        lease_expires_at=now + 40_001,
        limit=0,
        inline=inline,
    )
    async with db.read() as session:
        statuses = (await session.scalars(select(WebhookDelivery.status))).all()
    assert sorted(statuses) == ["delivered", "delivered"]
    assert len(threads) == 2
    assert (threads[0] == threading.get_ident()) is inline


async def test_a_tick_tells_when_the_next_delivery_falls_due(
    db: Database, queue: DeliveryQueue
) -> None:
    """Read in the tick's transaction, after its writes, only when the dispatcher will want
    it: after outcomes, or after a claim that came back short."""
    await add_deliveries(db, 3, due_at=1_000)
    now = now_ms()

    def claim(records: list[Outcome], limit: int, lease_ms: int) -> Any:
        return queue.tick(records, owner="o", now=now, lease_expires_at=now + lease_ms, limit=limit)

    full = await claim([], 2, 40_000)
    assert len(full.claimed) == 2 and not full.next_due_read
    # Short: the one row left is claimed too, so the earliest pending is the first lease's end.
    short = await claim([], 5, 50_000)
    assert len(short.claimed) == 1
    assert short.next_due_read and short.next_due == now + 40_000
    first, second = full.claimed
    retry = recorded(first, status="pending", now=now)
    assert retry.next_attempt_at == now + 10_000
    after_failure = await claim([retry], 0, 0)
    assert after_failure.next_due_read and after_failure.next_due == now + 10_000
    done = [recorded(second, now=now), recorded(short.claimed[0], now=now)]
    assert (await claim(done, 0, 0)).next_due == now + 10_000
    retried = await claim([], 5, 60_000)  # due only in 10 s: nothing to claim yet
    assert retried.claimed == [] and retried.next_due == now + 10_000
    async with db.write() as session:
        await session.execute(update(WebhookDelivery).values(status="delivered"))
    empty = await claim([], 5, 60_000)
    assert empty.next_due_read and empty.next_due is None


@pytest.mark.postgres
async def test_ticks_go_on_after_the_server_dropped_the_connection(
    pg_server: PostgresServer, pg_url: str, no_idle_ping: None
) -> None:
    # A restart drops the dispatcher's pooled connections. The next tick takes a fresh one
    # instead of the dead one coming back from the pool tick after tick.
    db = Database(pg_url, pool_size=1)
    await create_schema(db)
    await add_account(db, "acct_1", "whsec_one")
    await add_account(db, "acct_2", "whsec_two")
    queue = delivery_queue(db)
    try:
        await add_deliveries(db, 3)
        assert [item.id for item in await tick(queue, [], 1)] == ["whd_000"]
        pg_server.terminate(f"datname = '{pg_url.rsplit('/', 1)[1]}'")
        await asyncio.sleep(0.1)  # and asyncpg has seen it
        assert [item.id for item in await tick(queue, [], 1)] == ["whd_001"]
        assert [item.id for item in await tick(queue, [], 1)] == ["whd_002"]
    finally:
        await queue.close()
        await db.dispose()
