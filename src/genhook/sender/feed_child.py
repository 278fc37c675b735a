"""The helper process behind ``ProcessFeed``: ``python -m genhook.sender.feed_child``.

It reads its settings, database URL, lease owner and lease length from the first frame on
stdin, answers ``("ready",)``, then serves exchanges in order until stdin closes. Frames go
out on the original stdout; anything else written to stdout (a stray print) is sent to
stderr, so it cannot corrupt the pipe.
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
import os
import signal
import sys

from genhook.config import Settings
from genhook.db import Database
from genhook.lifeline import outlive_parent
from genhook.logs import configure_logging
from genhook.sender.fairness import Rooms
from genhook.sender.feed import LocalFeed, Outcome, encode_frame, read_frame
from genhook.sender.keys import KeyRing

log = logging.getLogger("genhook.sender.feed")


async def serve(pipe_in: int, pipe_out: int) -> None:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=2**26)
    await loop.connect_read_pipe(
        lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(pipe_in, "rb", buffering=0)
    )
    transport, protocol = await loop.connect_write_pipe(
        asyncio.streams.FlowControlMixin, os.fdopen(pipe_out, "wb", buffering=0)
    )
    writer = asyncio.StreamWriter(transport, protocol, None, loop)
    try:
        settings_json, database_url, owner, lease_ms = await read_frame(reader)
    except asyncio.IncompleteReadError:
        return
    try:
        settings = Settings.model_validate_json(settings_json)
        multiprocessing.current_process().name = "webhook-feed"  # named so in the logs
        configure_logging(settings, "webhook-feed")
        db = Database(database_url)
        # The loop here has nothing else to do: sign inline, no thread to hand over to.
        feed = LocalFeed(
            settings, db, KeyRing(db, settings), owner=owner, lease_ms=lease_ms, threads=False
        )
    except Exception as exc:
        writer.write(encode_frame(("failed", f"{type(exc).__name__}: {exc}")))
        await writer.drain()
        return
    writer.write(encode_frame(("ready",)))
    await writer.drain()
    # Started: from now on the end of the pipe stops it, once the exchange in hand is done.
    outlive_parent()
    try:
        while True:
            try:
                seq, outcomes, limit, rooms, returned = await read_frame(reader)
            except asyncio.IncompleteReadError:
                return  # the dispatcher closed the pipe: stop
            try:
                attempts = await feed.exchange(
                    [Outcome._make(o) for o in outcomes], limit, Rooms._make(rooms), returned
                )
            except Exception as exc:
                log.exception("webhook feed exchange failed")
                writer.write(encode_frame((seq, False, f"{type(exc).__name__}: {exc}")))
            else:
                writer.write(encode_frame((seq, True, [tuple(a) for a in attempts])))
            await writer.drain()
    finally:
        await feed.close()
        await db.dispose()


def main() -> None:
    # It stops when the dispatcher closes the pipe, after answering what it was asked: a
    # Ctrl+C or SIGTERM sent to the whole process group must not cut it short, or the
    # dispatcher's last outcomes would go unrecorded.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    # Keep the pipe's ends for frames; point fds 0 and 1 away from them.
    pipe_in, pipe_out = os.dup(0), os.dup(1)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    asyncio.run(serve(pipe_in, pipe_out))


if __name__ == "__main__":
    main()
