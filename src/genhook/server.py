"""``genhook serve``: migrate, bootstrap, then run the API and supervised worker processes.

The API runs in this process (uvicorn); each worker is a child process with its own event
loop and database handle, which dies with this process (see ``genhook.lifeline``). A worker
that dies is restarted and the tasks it held are requeued at once; the lease is the safety
net when nobody is left to do that. SIGTERM or Ctrl-C stops every claim at once, lets
in-flight tasks finish within ``shutdown_grace_seconds`` while the API stops, and releases
the rest.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import logging
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from genhook.config import Settings
from genhook.files import private_dir

if TYPE_CHECKING:
    from genhook.tasks.lifecycle import Lifecycle
    from genhook.tasks.worker import Worker

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
    from genhook.sender.keys import load_encryption_key
    from genhook.sender.secret_box import seal_plaintext_secrets

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


def worker_id_for(pid: int, index: int) -> str:
    """The lease owner name of worker ``index`` running as ``pid`` on this machine."""
    return f"{socket.gethostname()}:{pid}/{index}"


def worker_main(settings: Settings, index: int, parent: int | None = None) -> None:
    """Entry point of one worker process; ``parent`` is its supervisor's pid, if any."""
    import multiprocessing

    multiprocessing.current_process().name = f"worker-{index}"  # named so in the logs
    configure_logging(settings)
    if asyncio.run(_worker(settings, index, parent)):
        # An abandoned engine thread is still computing; leave without waiting for it.
        logging.shutdown()
        os._exit(EXIT_TAINTED)


async def _worker(settings: Settings, index: int, parent: int | None) -> bool:
    # Not the API's state: a worker without FastAPI and the console is ~27 MB smaller.
    from genhook.db import Database
    from genhook.engines.registry import build_registry
    from genhook.lifeline import ORPHAN_SIGNAL
    from genhook.net import AddressPolicy
    from genhook.storage import open_blob_store
    from genhook.tasks.worker import Worker

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    db = Database(
        settings.resolved_database_url,
        pool_timeout=settings.db_pool_timeout_seconds,
        connect_timeout=settings.db_connect_timeout_seconds,
    )
    worker = Worker(
        settings,
        db,
        open_blob_store(settings, db),
        build_registry(settings),
        AddressPolicy(allow_private=settings.webhook_allow_private_targets),
        worker_id=worker_id_for(os.getpid(), index),
    )
    orphaned = asyncio.Event()
    if parent is not None:
        loop.add_signal_handler(ORPHAN_SIGNAL, orphaned.set)
        if os.getppid() != parent:
            orphaned.set()
    orphan_watch = asyncio.create_task(_leave_when_orphaned(worker, orphaned))
    try:
        await worker.run(stop)
    finally:
        orphan_watch.cancel()
        await db.dispose()
    return worker.tainted


async def _leave_when_orphaned(worker: Worker, orphaned: asyncio.Event) -> None:
    """The supervisor died (the kernel signalled it): give back the task in hand and exit at
    once, so nothing of this generation keeps claiming next to the supervisor's successor."""
    await orphaned.wait()
    log.warning("worker %s: the supervisor is gone; leaving", worker.worker_id)
    with contextlib.suppress(Exception):
        await asyncio.wait_for(worker.lifecycle.release_owner(worker.worker_id, lost=False), 3)
    logging.shutdown()
    os._exit(0)


class WorkerPool:
    """Starts, restarts and stops worker processes, and gives back what a dead one held.

    Workers are plain child processes (``python -m genhook.lifeline``) started from the main
    thread, so the kernel's parent-death signal follows this process, not a helper thread.
    """

    def __init__(self, settings: Settings, count: int, lifecycle: Lifecycle | None = None) -> None:
        self.settings = settings
        self.count = count
        self.lifecycle = lifecycle
        self.processes: dict[int, subprocess.Popen[bytes]] = {}
        self.stopping = False
        self._payload = settings.model_dump_json().encode()

    def _start(self, index: int) -> None:
        process = subprocess.Popen(
            [sys.executable, "-m", "genhook.lifeline", str(os.getpid()), str(index)],
            stdin=subprocess.PIPE,
        )
        assert process.stdin is not None
        try:
            process.stdin.write(self._payload)
            process.stdin.close()
        except BrokenPipeError:
            pass
        self.processes[index] = process

    def start(self) -> None:
        for index in range(self.count):
            self._start(index)

    async def supervise(self, interval: float = 0.1) -> None:
        while not self.stopping:
            await asyncio.sleep(interval)
            for index, process in list(self.processes.items()):
                code = process.poll()
                if code is None or self.stopping:
                    continue
                log.warning("worker-%d exited with %s; restarting", index, code)
                self._start(index)
                await self._give_back(worker_id_for(process.pid, index), lost=code != 0)

    async def _give_back(self, worker_id: str, *, lost: bool) -> None:
        if self.lifecycle is None:
            return
        try:
            await self.lifecycle.release_owner(worker_id, lost=lost)
        except Exception:
            log.exception("could not requeue the tasks of %s; their leases will", worker_id)

    def begin_stop(self) -> None:
        """Stop every claim now: each worker finishes or releases its task, then exits."""
        self.stopping = True
        for process in self.processes.values():
            if process.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    process.send_signal(signal.SIGTERM)

    async def stop(self, grace: float) -> None:
        self.begin_stop()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + grace + 2
        for process in self.processes.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                await asyncio.to_thread(process.wait, max(0.0, deadline - loop.time()))
        for index, process in self.processes.items():
            if process.poll() is None:
                log.warning("worker-%d did not stop in time; killing it", index)
                process.kill()
                await asyncio.to_thread(process.wait, 5)
                await self._give_back(worker_id_for(process.pid, index), lost=False)


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
        from genhook.db import Database
        from genhook.storage import open_blob_store
        from genhook.tasks.lifecycle import Lifecycle

        # The supervisor's own handle: it requeues a dead worker's tasks at once, and still
        # can while the API shuts down.
        pool_db = Database(settings.resolved_database_url, pool_size=2)
        lifecycle = Lifecycle(settings, pool_db, open_blob_store(settings, pool_db))
        pool = WorkerPool(settings, settings.workers, lifecycle)
        pool.start()
        supervisor = asyncio.create_task(pool.supervise())
        state = build_state(settings)
        app = create_app(state)
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

        def request_exit() -> None:
            # Workers stop claiming at once and finish in parallel with the API's shutdown.
            pool.begin_stop()
            server.request_exit()
            state.watcher.close()

        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, request_exit)
        try:
            await server.serve()
        finally:
            supervisor.cancel()
            await pool.stop(settings.shutdown_grace_seconds)
            await pool_db.dispose()

    # Workers also receive a terminal's Ctrl-C; they stop gracefully on their own.
    asyncio.run(main())


def run_worker_only(settings: Settings) -> None:
    """``genhook worker``: a worker without the API, for machines that only compute."""
    configure_logging(settings)
    os.umask(0o077)
    worker_main(settings, 0)
