"""SQLite writers of different processes take turns off the event loop (``WriterTurn``).

Two ``Database`` handles on one file stand for two processes: ``flock`` locks belong to an
open file, so two handles exclude each other exactly as two processes do.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys

from sqlalchemy import text

from genhook.db import Database
from genhook.db.migrate import upgrade


async def _ticks_while(waiting: asyncio.Task[None], seconds: float) -> int:
    """How many 1 ms sleeps the loop completes in ``seconds`` while ``waiting`` is pending."""
    ticks = 0
    loop = asyncio.get_running_loop()
    end = loop.time() + seconds
    while loop.time() < end:
        await asyncio.sleep(0.001)
        ticks += 1
    assert not waiting.done()
    return ticks


async def test_a_writer_waits_for_another_process_without_stalling_the_loop(
    sqlite_url: str,
) -> None:
    await asyncio.to_thread(upgrade, sqlite_url)
    holder, waiter = Database(sqlite_url), Database(sqlite_url)
    order: list[str] = []
    try:
        released = asyncio.Event()

        async def hold() -> None:
            async with holder.write() as session:
                await session.execute(text("SELECT 1"))
                order.append("held")
                await released.wait()
            order.append("released")

        async def write() -> None:
            async with waiter.write() as session:
                await session.execute(text("SELECT 1"))
                order.append("second writer")

        holding = asyncio.create_task(hold())
        while not order:
            await asyncio.sleep(0)
        writing = asyncio.create_task(write())
        # The loop goes on serving while the second writer waits for its turn: SQLite's busy
        # handler would have stalled it for the whole hold.
        assert await _ticks_while(writing, 0.3) > 20
        released.set()
        await asyncio.wait_for(asyncio.gather(holding, writing), 10)
        assert order == ["held", "released", "second writer"]
    finally:
        await holder.dispose()
        await waiter.dispose()


async def test_a_canceled_wait_gives_the_turn_back(sqlite_url: str) -> None:
    await asyncio.to_thread(upgrade, sqlite_url)
    first, second, third = Database(sqlite_url), Database(sqlite_url), Database(sqlite_url)
    try:
        released = asyncio.Event()
        held = asyncio.Event()

        async def hold() -> None:
            async with first.write_turn():
                held.set()
                await released.wait()

        holding = asyncio.create_task(hold())
        await held.wait()

        async def write() -> None:
            async with second.write() as session:
                await session.execute(text("SELECT 1"))

        waiting = asyncio.create_task(write())
        await asyncio.sleep(0.1)
        waiting.cancel()
        released.set()
        await holding
        # The canceled waiter's thread got the lock after it had gone, and let it go.
        async with asyncio.timeout(10):
            async with third.write() as session:
                await session.execute(text("SELECT 1"))
    finally:
        for db in (first, second, third):
            await db.dispose()


def test_a_writer_process_waits_for_the_turn_of_another(sqlite_url: str) -> None:
    """Across real processes: a process holding the turn keeps another's writes waiting."""
    upgrade(sqlite_url)
    database = sqlite_url.split("///", 1)[1]
    script = (
        "import fcntl, os, sys, time\n"
        f"fd = os.open({database + '-writer'!r}, os.O_RDWR | os.O_CREAT, 0o600)\n"
        "fcntl.flock(fd, fcntl.LOCK_EX)\n"
        "print('held', flush=True)\n"
        "sys.stdin.readline()\n"
    )
    holder = subprocess.Popen(
        [sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:

        async def main() -> list[str]:
            db = Database(sqlite_url)
            events: list[str] = []
            try:
                assert holder.stdout is not None
                await asyncio.to_thread(holder.stdout.readline)

                async def write() -> None:
                    async with db.write() as session:
                        await session.execute(text("SELECT 1"))
                    events.append("written")

                writing = asyncio.create_task(write())
                await _ticks_while(writing, 0.3)
                events.append("let go")
                assert holder.stdin is not None
                holder.stdin.write("\n")
                holder.stdin.flush()
                await asyncio.wait_for(writing, 10)
            finally:
                await db.dispose()
            return events

        assert asyncio.run(main()) == ["let go", "written"]
    finally:
        holder.kill()
        holder.wait()
