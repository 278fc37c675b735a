"""How the dispatcher paces its claims, against a scripted attempt feed (the port between
the sending half and the bookkeeping half), so no database or process is involved."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import pytest

from genhook.config import Settings
from genhook.db import Database
from genhook.net import AddressPolicy
from genhook.sender.dispatcher import Dispatcher
from genhook.sender.fairness import Rooms, Stop
from genhook.sender.queue import UNLIMITED, Outcome, Ticked
from tests.support.webhook_receiver import create_schema


class ScriptedFeed:
    """Answers every claim with nothing (and, as the queue would, that nothing is pending);
    a claim can be held until released."""

    claims_alone = False

    def __init__(self) -> None:
        self.claims: list[float] = []
        self.in_flight = 0
        self.most_in_flight = 0
        self.hold: asyncio.Event | None = None

    async def start(self) -> None:
        pass

    async def exchange(
        self,
        outcomes: Sequence[Outcome],
        limit: int,
        rooms: Rooms = UNLIMITED,
        returned: Sequence[tuple[str, int]] = (),
        inline: bool = False,
        stops: Sequence[Stop] = (),
    ) -> Ticked:
        if not limit:
            return Ticked([], next_due_read=bool(outcomes or returned))
        self.claims.append(time.monotonic())
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            if self.hold is not None:
                await self.hold.wait()
            await asyncio.sleep(0.005)
            return Ticked([], next_due_read=True)
        finally:
            self.in_flight -= 1

    async def close(self) -> None:
        pass


@pytest.fixture
async def db(tmp_path: Path) -> AsyncIterator[Database]:
    database = Database(f"sqlite+aiosqlite:///{tmp_path / 'pacing.db'}")
    await create_schema(database)
    yield database
    await database.dispose()


def dispatcher(tmp_path: Path, db: Database, poll: float) -> tuple[Dispatcher, ScriptedFeed]:
    settings = Settings(data_dir=tmp_path, webhook_poll_seconds=poll)
    feed = ScriptedFeed()
    d = Dispatcher(settings, db, policy=AddressPolicy(), keyring=None)  # type: ignore[arg-type]
    d.feed = feed
    return d, feed


async def test_an_idle_dispatcher_reads_instead_of_claiming(tmp_path: Path, db: Database) -> None:
    """A claim is a write transaction: with nothing due, each poll only reads the earliest
    scheduled attempt, so after the first claim no other is made."""
    d, feed = dispatcher(tmp_path, db, poll=0.05)
    stop = asyncio.Event()
    run = asyncio.create_task(d.run(stop))
    await asyncio.sleep(0.6)
    stop.set()
    await run
    assert feed.most_in_flight == 1
    assert len(feed.claims) == 1, feed.claims


async def test_a_wake_during_a_claim_is_not_lost(tmp_path: Path, db: Database) -> None:
    """The claim in flight may have read the database before the new delivery committed,
    so its empty answer must not put the next claim off until the poll interval."""
    d, feed = dispatcher(tmp_path, db, poll=30.0)
    feed.hold = asyncio.Event()
    stop = asyncio.Event()
    run = asyncio.create_task(d.run(stop))
    try:
        async with asyncio.timeout(5):
            while not feed.claims:
                await asyncio.sleep(0.005)
        d.wake()  # a delivery committed while the claim was in flight
        feed.hold.set()
        async with asyncio.timeout(5):
            while len(feed.claims) < 2:
                await asyncio.sleep(0.005)
        # With nothing more due and no wake, the next claim waits for the poll interval.
        await asyncio.sleep(0.3)
        assert len(feed.claims) == 2
    finally:
        stop.set()
        await run
