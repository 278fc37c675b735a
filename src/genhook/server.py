"""``genhook serve``: migrate, bootstrap, then run the API and supervised worker processes.

The API runs in this process (uvicorn); each worker is a spawned process with its own event
loop and database handle. A worker that dies is restarted; its task's lease expires and
the sweeper requeues it. SIGTERM or Ctrl-C stops claims, lets in-flight tasks finish within
``shutdown_grace_seconds`` and releases the rest.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import logging
import multiprocessing
import os
import signal
from collections.abc import Iterator
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import Any

from genhook.config import Settings
from genhook.files import private_dir

log = logging.getLogger("genhook")


def configure_logging(settings: Settings) -> None:
    logging.basicConfig(
        level=settings.log_level.upper(),
        format="%(asctime)s %(levelname)s %(processName)s %(name)s: %(message)s",
    )


async def bootstrap(settings: Settings) -> dict[str, str] | None:
    """Seal signing secrets left in clear; on an empty database, create the default account
    and write its secrets to a 0600 file."""
    from sqlalchemy import func, select

    from genhook.accounts import create_account
    from genhook.db import Account, Database
    from genhook.webhooks.keys import load_encryption_key
    from genhook.webhooks.secret_box import seal_plaintext_secrets

    db = Database(settings.resolved_database_url)
    encryption_key = load_encryption_key(settings)
    try:
        sealed = await seal_plaintext_secrets(db, encryption_key)
        if sealed:
            log.info("encrypted %d signing secrets stored in clear by an older version", sealed)
        async with db.read() as session:
            count = (await session.execute(select(func.count()).select_from(Account))).scalar_one()
        if count:
            return None
        account = await create_account(db, "default", encryption_key=encryption_key)
    finally:
        await db.dispose()
    credentials = {
        "account_id": account.account_id,
        "api_key": account.api_key,
        "signing_secret": account.signing_secret,
    }
    path = settings.data_dir / "credentials.json"
    private_dir(path.parent)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        json.dump(credentials, handle, indent=2)
    return credentials


EXIT_TAINTED = 3


def worker_main(settings: Settings, index: int) -> None:
    """Entry point of one worker process."""
    configure_logging(settings)
    if asyncio.run(_worker(settings, index)):
        # An abandoned engine thread is still computing; leave without waiting for it.
        logging.shutdown()
        os._exit(EXIT_TAINTED)


async def _worker(settings: Settings, index: int) -> bool:
    from genhook.api.app import build_state
    from genhook.tasks.worker import Worker, default_worker_id

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    orphan_watch = asyncio.create_task(_stop_when_orphaned(stop))
    state = build_state(settings)
    worker = Worker(
        state.settings,
        state.db,
        state.storage,
        state.registry,
        state.policy,
        worker_id=f"{default_worker_id()}/{index}",
    )
    try:
        await worker.run(stop)
    finally:
        orphan_watch.cancel()
        await state.db.dispose()
    return worker.tainted


async def _stop_when_orphaned(stop: asyncio.Event) -> None:
    """A worker whose parent died (kill -9) stops gracefully instead of running on alone."""
    parent = os.getppid()
    while not stop.is_set():
        await asyncio.sleep(1.0)
        if os.getppid() != parent:
            logging.getLogger(__name__).warning("parent process is gone; stopping")
            stop.set()


class WorkerPool:
    """Starts, restarts and stops worker processes."""

    def __init__(self, settings: Settings, count: int) -> None:
        self.settings = settings
        self.count = count
        self.context = multiprocessing.get_context("spawn")
        self.processes: dict[int, BaseProcess] = {}
        self.stopping = False

    def _start(self, index: int) -> None:
        process = self.context.Process(
            target=worker_main, args=(self.settings, index), name=f"worker-{index}", daemon=False
        )
        process.start()
        self.processes[index] = process

    def start(self) -> None:
        for index in range(self.count):
            self._start(index)

    async def supervise(self) -> None:
        while not self.stopping:
            await asyncio.sleep(1.0)
            for index, process in list(self.processes.items()):
                if not process.is_alive() and not self.stopping:
                    log.warning("worker-%d exited with %s; restarting", index, process.exitcode)
                    self._start(index)

    async def stop(self, grace: float) -> None:
        self.stopping = True
        for process in self.processes.values():
            if process.is_alive() and process.pid:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(process.pid, signal.SIGTERM)
        deadline = asyncio.get_running_loop().time() + grace + 5
        for process in self.processes.values():
            remaining = max(0.0, deadline - asyncio.get_running_loop().time())
            await asyncio.to_thread(process.join, remaining)
            if process.is_alive():
                log.warning("%s did not stop in time; killing it", process.name)
                process.kill()
            process.join(1)


def _server_class() -> type[Any]:
    import uvicorn

    class Server(uvicorn.Server):
        """uvicorn without its own signal handling: ours stops the API, then the workers,
        and exits 0 (uvicorn would re-raise the signal and skip the workers' shutdown)."""

        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            yield

        def request_exit(self) -> None:
            if self.should_exit:
                self.force_exit = True
            self.should_exit = True

    return Server


def connection_limits(settings: Settings) -> dict[str, Any]:
    """uvicorn settings for read deadlines, the connection cap and header size."""
    from genhook.api.connections import GuardedH11Protocol, raise_file_limit

    files = raise_file_limit()
    # Keep descriptors free for the database, blobs and outgoing webhooks.
    cap = max(1, min(settings.max_connections, files - 100))
    return {
        "http": GuardedH11Protocol.configure(
            header_timeout=settings.header_timeout_seconds,
            body_timeout=settings.body_timeout_seconds,
            max_connections=cap,
        ),
        "timeout_keep_alive": settings.keep_alive_seconds,
        "h11_max_incomplete_event_size": 16 * 1024,
    }


def serve(settings: Settings) -> None:
    import uvicorn

    from genhook.api.connections import RepeatFilter, quiet_accept_errors

    _Server = _server_class()

    from genhook.api.app import build_state, create_app
    from genhook.db.migrate import upgrade

    configure_logging(settings)
    # Everything the service creates (database, WAL, blobs, key file) is its user's alone.
    os.umask(0o077)
    private_dir(settings.data_dir)
    upgrade(settings.resolved_database_url)
    credentials = asyncio.run(bootstrap(settings))
    if credentials:
        path = Path(settings.data_dir / "credentials.json").resolve()
        print("Created the default account. Keep these; they are shown once:", flush=True)
        print(f"  API key:        {credentials['api_key']}", flush=True)
        print(f"  signing secret: {credentials['signing_secret']}", flush=True)
        print(f"  (also written to {path}, mode 0600)", flush=True)

    async def main() -> None:
        pool = WorkerPool(settings, settings.workers)
        pool.start()
        supervisor = asyncio.create_task(pool.supervise())
        app = create_app(build_state(settings))
        config = uvicorn.Config(
            app,
            host=settings.host,
            port=settings.port,
            log_level=settings.log_level.lower(),
            access_log=False,
            timeout_graceful_shutdown=int(settings.shutdown_grace_seconds) or None,
            **connection_limits(settings),
        )
        quiet_accept_errors(asyncio.get_running_loop())
        logging.getLogger("uvicorn.error").addFilter(RepeatFilter())
        server = _Server(config)
        # Everything imported and built so far lives for the whole process: keep it out of
        # the collector's full passes, which otherwise stall requests for milliseconds.
        gc.collect()
        gc.freeze()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, server.request_exit)
        try:
            await server.serve()
        finally:
            supervisor.cancel()
            await pool.stop(settings.shutdown_grace_seconds)

    # Workers also receive a terminal's Ctrl-C; they stop gracefully on their own.
    asyncio.run(main())


def run_worker_only(settings: Settings) -> None:
    """``genhook worker``: a worker without the API, for machines that only compute."""
    configure_logging(settings)
    os.umask(0o077)
    worker_main(settings, 0)
