"""A full disk on the delivery side: an acknowledged webhook is recorded, not sent again."""

from __future__ import annotations

import asyncio
import errno
import os
from collections.abc import Sequence
from pathlib import Path

from sqlalchemy import select

from genhook.db import WebhookAttempt, WebhookDelivery
from genhook.sender.dispatcher import Dispatcher
from genhook.sender.feed import LocalFeed
from genhook.sender.keys import KeyRing
from genhook.sender.queue import Outcome
from genhook.wiring import webhook_service
from tests.support.webhook_receiver import (
    FeedWrapper,
    Receiver,
    delivery_database,
    enqueue,
    status,
    terminal_task,
    webhook_settings,
)


class DiskFullOnce(FeedWrapper):
    """The delivery queue's disk is full for the first record of an outcome: the write
    fails with ENOSPC, as the kernel answers, and then the disk has room again."""

    def __init__(self, feed: LocalFeed) -> None:
        super().__init__(feed)
        self.failed = 0

    def before(self, outcomes: Sequence[Outcome]) -> None:
        if outcomes and not self.failed:
            self.failed += 1
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


async def test_acknowledgement_survives_a_full_disk(tmp_path: Path, database_url: str) -> None:
    # A short lease: dropped, the outcome would be re-sent well within the test. Not shorter:
    # on a busy machine a 0.5 s attempt timed out after the receiver had answered.
    settings = webhook_settings(tmp_path, database_url, webhook_timeout_seconds=2.0)
    db = await delivery_database(settings)
    receiver = await Receiver(status(200)).start()
    try:
        delivery_id = await enqueue(
            db, terminal_task("t1", f"http://127.0.0.1:{receiver.port}/hook")
        )
        dispatcher = Dispatcher(
            settings,
            db,
            policy=webhook_service(settings, db).policy,
            keyring=KeyRing(db, settings),
            lease_margin_seconds=0.2,
        )
        feed = DiskFullOnce(dispatcher.feed)
        dispatcher.feed = feed
        stop = asyncio.Event()
        run = asyncio.create_task(dispatcher.run(stop))
        async with asyncio.timeout(20):
            while True:
                async with db.read() as session:
                    row = await session.get(WebhookDelivery, delivery_id)
                if row is not None and row.status == "delivered":
                    break
                await asyncio.sleep(0.02)
        # Longer than the lease (2.2 s): a lost acknowledgement would have been sent again.
        await asyncio.sleep(3.0)
        stop.set()
        await run
        assert feed.failed == 1
        assert len(receiver.received) == 1
        async with db.read() as session:
            attempts = (await session.scalars(select(WebhookAttempt.number))).all()
        assert list(attempts) == [1]
    finally:
        await receiver.stop()
        await db.dispose()
