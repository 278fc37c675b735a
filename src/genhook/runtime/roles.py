"""The service's process roles, and the release process of ``genhook serve``.

``genhook api`` answers HTTP, ``genhook worker`` runs engines and ``genhook dispatcher``
delivers webhooks and sweeps leases; each runs any number of times against one database.
``genhook serve`` (``genhook.runtime.serve``) runs them all as children of its supervisor
(``genhook.runtime.supervisor``), processes that die with it (see
``genhook.runtime.lifeline``). A child that dies is restarted; the tasks a dead worker held
and the deliveries a dead dispatcher held are given back at once (their leases are the
safety net when nobody is left to do that). SIGTERM or Ctrl-C stops every claim at once,
lets in-flight work finish within ``shutdown_grace_seconds``, and exits 0.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import signal
import socket
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, Protocol

from genhook.config import Settings
from genhook.files import private_dir, tighten_data
from genhook.runtime.supervisor import EXIT_CANNOT_START, dispatcher_owner_for, worker_id_for

if TYPE_CHECKING:
    from genhook.api.deps import AppState
    from genhook.db import Database
    from genhook.runtime.services import Services
    from genhook.storage import BlobStore
    from genhook.tasks.lifecycle import Lifecycle
    from genhook.tasks.worker import Worker

log = logging.getLogger("genhook")


def configure_logging(settings: Settings, role: str = "serve") -> None:
    """What every process configures first: its log lines and, when the ``OTEL_*``
    variables ask for them, its traces (``genhook.tracing``; only api, worker, dispatcher)."""
    from genhook import tracing
    from genhook.logs import configure_logging as configure

    configure(settings, role)
    tracing.setup(role)


EXIT_TAINTED = 3
# Exit code of a role refusing to start on a database below the newest schema.
EXIT_REFUSED = 2


def process_name(role: str, index: int, parent: int | None) -> str:
    """How a role process names itself in the logs: ``worker-1`` under a supervisor (one
    machine), ``worker@HOST:PID`` on its own, where many machines log as worker 0."""
    if parent is not None:
        return f"{role}-{index}"
    return f"{role}@{socket.gethostname()}:{os.getpid()}"


def _name_process(role: str, index: int, parent: int | None) -> None:
    import multiprocessing

    multiprocessing.current_process().name = process_name(role, index, parent)


def require_migrated(settings: Settings) -> None:
    """Refuse to run a role on a database that is not at the newest schema."""
    from genhook.db.migrate import schema_problem

    problem = schema_problem(settings.resolved_database_url)
    if problem is not None:
        log.error(
            "%s; run `genhook db upgrade` (or `genhook serve`, which migrates) first", problem
        )
        logging.shutdown()
        raise SystemExit(EXIT_REFUSED)


def _watch_parent(parent: int | None, on_orphaned: Any) -> None:
    """Call ``on_orphaned`` when the supervisor ``parent`` dies: its lifeline's watch sends
    ``ORPHAN_SIGNAL``, which ended the process at once until now (``runtime/lifeline.py``)."""
    from genhook.runtime.lifeline import ORPHAN_SIGNAL

    if parent is None:
        return
    asyncio.get_running_loop().add_signal_handler(ORPHAN_SIGNAL, on_orphaned)


def _exit_on_signals(role: ApiRole) -> None:
    """The same signal twice stops the API at once (uvicorn's force exit), skipping the
    requests in flight. SIGINT and SIGTERM once each is one request to stop: a terminal's
    Ctrl-C reaches every process of ``genhook serve``, whose supervisor then sends its own
    SIGTERM."""
    seen: set[int] = set()

    def on_signal(sig: int) -> None:
        role.request_exit(force=sig in seen)
        seen.add(sig)

    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal, sig)


def _stop_on_signals(stop: Any) -> None:
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop)


# -- the shape of a role --------------------------------------------------------------------


class Role(Protocol):
    """What one process runs: the api, a worker or a dispatcher, on its own (``genhook api``,
    ``genhook worker``, ``genhook dispatcher``) or as a child of ``genhook serve``'s
    supervisor. ``_run_role`` drives one."""

    async def run(self, stop: asyncio.Event) -> None:
        """Do the role's work until ``stop`` is set, then finish or give back what it holds."""
        ...

    async def ready(self) -> list[str]:
        """What keeps this process from doing its work now: empty when it is ready
        (``/readyz``, on the API's port or the role's health port)."""
        ...

    def release(self) -> None:
        """The supervisor is gone: let go at once of what this process holds (a worker's
        task, the API's port, a dispatcher's leases), so that nothing of this generation
        keeps working beside the supervisor's successor."""
        ...


async def _run_role(
    role: Role, settings: Settings, parent: int | None, stop: asyncio.Event, *, health: bool
) -> None:
    """Run ``role`` until ``stop``; ``release`` it when the supervisor ``parent`` dies.
    ``health``: with the role's health port (``GENHOOK_HEALTH_PORT``), if one is set."""
    from genhook.runtime.health import health_port

    _watch_parent(parent, role.release)
    if not health:
        await role.run(stop)
        return
    async with health_port(settings, role.ready):
        await role.run(stop)


# -- worker ---------------------------------------------------------------------------------


class WorkerRole:
    """Claims tasks and runs engines (``genhook.tasks.worker.Worker``) until ``stop``.

    ``liveness``: a standalone worker on PostgreSQL, whose database session tells the
    sweeper it is alive (``genhook.tasks.liveness``) while it runs.
    """

    def __init__(self, state: Services, *, worker_id: str, liveness: bool = False) -> None:
        from genhook.tasks.worker import Worker

        self.state = state
        self.liveness = liveness
        self.worker = worker = Worker.sharing(state, worker_id=worker_id)
        settings = state.settings
        if settings.worker_concurrency:
            # Only models that allow several calls at once (I/O-bound engines, thread-safe
            # synchronous ones) take it; the others keep one.
            worker.limits = {
                model: settings.worker_concurrency if limit > 1 else limit
                for model, limit in worker.limits.items()
            }
        self._done = False
        self._leaving: asyncio.Task[None] | None = None

    @property
    def tainted(self) -> bool:
        """An abandoned engine thread is still computing: the process must not wait for it."""
        return self.worker.tainted

    async def run(self, stop: asyncio.Event) -> None:
        from genhook.tasks.liveness import hold_liveness

        try:
            async with contextlib.AsyncExitStack() as stack:
                if self.liveness:
                    await stack.enter_async_context(
                        hold_liveness(
                            self.state.settings.resolved_database_url, self.worker.worker_id
                        )
                    )
                await self.worker.run(stop)
        finally:
            self._done = True
            if self._leaving is not None:
                self._leaving.cancel()

    async def ready(self) -> list[str]:
        from genhook.runtime.services import ready_problems

        problems = await ready_problems(self.state)
        if not self.worker.preloaded:
            problems.append("the worker is still loading its --preload models")
        return problems

    def release(self) -> None:
        if not self._done and self._leaving is None:
            self._leaving = asyncio.create_task(_leave_when_orphaned(self.worker))


def _prepare_role(settings: Settings, role: str) -> None:
    """What a role started on its own (``genhook api|worker|dispatcher``) does first: its
    own private data directory, even when blobs live in a bucket, and a current schema."""
    configure_logging(settings, role)
    os.umask(0o077)
    private_dir(settings.data_dir)
    tighten_data(settings)
    require_migrated(settings)


def worker_main(settings: Settings, index: int, parent: int | None = None) -> None:
    """Entry point of one worker process; ``parent`` is its supervisor's pid, if any."""
    from genhook.tasks.worker import PreloadFailed

    _name_process("worker", index, parent)
    configure_logging(settings, "worker")
    runner = asyncio.Runner(loop_factory=_fast_loop())
    try:
        tainted, loading = runner.run(_worker(settings, index, parent))
    except PreloadFailed as failure:
        runner.close()
        log.error("%s", failure)
        # Under serve, a status that says so however long the preload took; alone, 1.
        raise SystemExit(EXIT_CANNOT_START if parent is not None else 1) from None
    except BaseException:
        runner.close()
        raise
    if tainted or loading:
        # An abandoned engine thread is still computing, or a model still loading for a task
        # given back; leave without waiting for it (closing the loop would: it joins the
        # executor's threads).
        if not tainted:
            log.info("leaving with a model load unfinished")
        logging.shutdown()
        os._exit(EXIT_TAINTED if tainted else 0)
    runner.close()


async def _worker(settings: Settings, index: int, parent: int | None) -> tuple[bool, bool]:
    """Run the worker role until it stops; whether it ended tainted, and with a model load
    still running."""
    # Not the API's state: a worker without FastAPI and the console is ~27 MB smaller.
    from genhook.runtime.services import open_services
    from genhook.storage.blobs import close_blob_store
    from genhook.tasks.liveness import LIVE_SUFFIX

    stop = asyncio.Event()
    _stop_on_signals(stop.set)
    state = open_services(settings, claims=True)
    worker_id = worker_id_for(os.getpid(), index)
    # On its own on PostgreSQL, the worker's database session tells the sweeper it is alive.
    liveness = parent is None and state.db.is_postgres
    if liveness:
        worker_id += LIVE_SUFFIX
    role = WorkerRole(state, worker_id=worker_id, liveness=liveness)
    try:
        await _run_role(role, settings, parent, stop, health=True)
    finally:
        await close_blob_store(state.storage)
        await state.db.dispose()
    return role.tainted, role.worker.loading


async def _leave_when_orphaned(worker: Worker) -> None:
    """The supervisor died (the kernel signalled it): give back the task in hand and exit at
    once, so nothing of this generation keeps claiming next to the supervisor's successor."""
    log.warning("worker %s: the supervisor is gone; leaving", worker.worker_id)
    worker.lifecycle.closed = True  # a claim in flight takes nothing now
    with contextlib.suppress(Exception):
        await asyncio.wait_for(worker.lifecycle.release_owner(worker.worker_id, lost=False), 3)
    logging.shutdown()
    os._exit(0)


def run_worker(settings: Settings) -> None:
    """``genhook worker``: one worker process, for machines that only compute."""
    _prepare_role(settings, "worker")
    worker_main(settings, 0)


# -- dispatcher -----------------------------------------------------------------------------


async def sweep_forever(lifecycle: Lifecycle, interval: float, stop: asyncio.Event) -> None:
    """Expire leases of vanished workers and end overdue tasks, every ``interval``."""
    from genhook.faults import is_infrastructure_error

    while not stop.is_set():
        try:
            await lifecycle.sweep()
        except Exception as error:
            if not is_infrastructure_error(error):
                log.exception("sweep failed; retrying")
            else:  # planned: one line with the cause, folded while it lasts (genhook.logs)
                log.warning("sweep failed; retrying (%s)", error)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), interval)


class DispatcherRole:
    """Webhook delivery, reconciliation, retention and the task sweeper, until ``stop``.

    Run it in any number of processes against one database: deliveries are claimed under
    leases and the sweeper's updates are idempotent.
    """

    def __init__(self, state: Services, *, owner: str | None = None) -> None:
        from genhook.wiring import lifecycle, webhook_service

        self.state = state
        # The same policy (and resolver) as submit-time checks guards every delivery.
        self.webhooks = webhook_service(state.settings, state.db, policy=state.policy, owner=owner)
        self.lifecycle = lifecycle(state.settings, state.db, state.storage)
        self._stop: asyncio.Event | None = None
        self._released = False

    @property
    def started(self) -> bool:
        dispatcher = self.webhooks.dispatcher
        return dispatcher is not None and dispatcher.started.is_set()

    async def ready(self) -> list[str]:
        from genhook.runtime.services import ready_problems

        problems = await ready_problems(self.state)
        if not self.started:
            problems.append("the webhook dispatcher has not started")
        return problems

    def release(self) -> None:
        """Stop, as on SIGTERM: the last callbacks go out and the leases are let go of."""
        import multiprocessing

        log.warning("%s: the supervisor is gone; leaving", multiprocessing.current_process().name)
        self._released = True
        if self._stop is not None:
            self._stop.set()

    async def run(self, stop: asyncio.Event) -> None:
        self._stop = stop
        if self._released:
            stop.set()
        interval = self.state.settings.sweep_interval_seconds
        sweeper = asyncio.create_task(sweep_forever(self.lifecycle, interval, stop))
        try:
            await self.webhooks.run(stop)
        finally:
            stop.set()
            await asyncio.gather(sweeper, return_exceptions=True)


def dispatcher_main(settings: Settings, index: int, parent: int | None = None) -> None:
    """Entry point of one dispatcher process: webhook delivery, reconciliation, retention
    and the task sweeper."""
    _name_process("dispatcher", index, parent)
    configure_logging(settings, "dispatcher")
    with asyncio.Runner(loop_factory=_fast_loop()) as runner:
        runner.run(_dispatcher(settings, index, parent))


def _fast_loop() -> Any:
    """uvloop's event loop factory when it is installed: every role's loop is busy with
    sockets and callbacks (HTTP, the database, wake-ups), and that is where uvloop saves CPU."""
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop


async def _dispatcher(settings: Settings, index: int, parent: int | None) -> None:
    from genhook.runtime.services import open_services

    stop = asyncio.Event()
    _stop_on_signals(stop.set)
    state = open_services(settings, claims=True)
    role = DispatcherRole(state, owner=dispatcher_owner_for(os.getpid(), index))
    requests = asyncio.create_task(_release_requests(state)) if parent is not None else None
    try:
        await _run_role(role, settings, parent, stop, health=True)
    finally:
        if requests is not None:
            requests.cancel()
            await asyncio.gather(requests, return_exceptions=True)
        await state.db.dispose()


async def _release_requests(state: Services) -> None:
    """Give back what a dead sibling held as soon as the supervisor asks, on standard input
    (``genhook.runtime.supervisor.RELEASE`` lines): this process is running and connected, where a
    fresh release process would take seconds to start."""
    from genhook.runtime.supervisor import RELEASE

    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    pipe = os.fdopen(0, "rb", buffering=0, closefd=False)
    transport, _ = await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), pipe)
    try:
        while line := await reader.readline():
            words = line.decode(errors="replace").split()
            if len(words) != 4 or words[0] != RELEASE:
                log.warning("ignored a request from the supervisor: %r", line[:200])
                continue
            _, what, owner, how = words
            try:
                await release_held(
                    state.settings, state.db, state.storage, what, owner, lost=how == "lost"
                )
            except Exception as exc:
                log.error("could not give back what %s held (%s); its leases will", owner, exc)
    finally:
        transport.close()


def run_dispatcher(settings: Settings) -> None:
    """``genhook dispatcher``: webhook delivery and lease sweeping, without the API."""
    _prepare_role(settings, "dispatcher")
    dispatcher_main(settings, 0)


# -- api ------------------------------------------------------------------------------------


def announce_ready(settings: Settings) -> None:
    """Say where the service, its console and its API reference are, once it answers: the
    first thing a newcomer needs from ``genhook serve``, as plain lines (a log record in the
    JSON log format)."""
    base = settings.resolved_public_base_url
    if settings.log_format == "json":
        log.info("ready on %s (console %s/console, API reference %s/docs)", base, base, base)
        return
    print(
        f"genhook is ready on {base}\n"
        f"  console:       {base}/console\n"
        f"  API reference: {base}/docs",
        flush=True,
    )


def _server_class() -> type[Any]:
    import uvicorn

    class Server(uvicorn.Server):
        """uvicorn without its own signal handling: ours stops the API and exits 0 (uvicorn
        would re-raise the signal, which its supervisor would count as a crash)."""

        # Called once the server has started listening (``announce_ready``).
        on_started: Any = None

        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            yield

        async def startup(self, sockets: list[socket.socket] | None = None) -> None:
            await super().startup(sockets)
            if self.started and self.on_started is not None:
                self.on_started()

        def request_exit(self, force: bool = False) -> None:
            self.force_exit = self.force_exit or force
            self.should_exit = True
            wake = getattr(self, "_wake", None)
            if wake is not None:
                wake.set()

        async def main_loop(self) -> None:
            """uvicorn's loop wakes ten times a second to notice an exit; this one wakes
            once a second, for the Date header (tick 0 always refreshes it), and at once on
            ``request_exit``."""
            self._wake = asyncio.Event()
            while not await self.on_tick(0):
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), 1.0)

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


def api_main(settings: Settings, parent: int | None = None, fd: int | None = None) -> None:
    """Entry point of the API process; ``fd`` is a listening socket its supervisor opened."""
    _name_process("api", 0, parent)
    configure_logging(settings, "api")
    with asyncio.Runner(loop_factory=_fast_loop()) as runner:
        runner.run(_api(settings, parent, fd))


async def _api(settings: Settings, parent: int | None, fd: int | None) -> None:
    import uvicorn

    from genhook.api.app import build_state, create_app
    from genhook.api.connections import RepeatFilter, quiet_accept_errors
    from genhook.sender.keys import ensure_signing_key

    state = build_state(settings)
    # JWKS publishes the active key from the first request on, dispatcher or not.
    await ensure_signing_key(state.db, settings)
    app = create_app(state)
    config = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level.lower(),
        log_config=None,  # our handler (genhook.logs) formats uvicorn's lines too
        access_log=False,
        # Forwarded headers are believed only from GENHOOK_TRUSTED_PROXIES (create_app).
        proxy_headers=False,
        timeout_graceful_shutdown=int(settings.shutdown_grace_seconds) or None,
        **connection_limits(settings),
    )
    quiet_accept_errors(asyncio.get_running_loop())
    logging.getLogger("uvicorn.error").addFilter(RepeatFilter())
    sockets = [socket.socket(fileno=fd)] if fd is not None else None
    server = _server_class()(config)
    server.on_started = lambda: announce_ready(settings)
    role = ApiRole(state, server, sockets)
    # Everything imported and built so far lives for the whole process: keep it out of
    # the collector's full passes, which otherwise stall requests for milliseconds.
    gc.collect()
    gc.freeze()
    _exit_on_signals(role)
    await _run_role(role, settings, parent, asyncio.Event(), health=False)


class ApiRole:
    """The HTTP API: uvicorn serving the FastAPI app on ``sockets`` (inherited from the
    supervisor) or on the configured port, until ``stop`` or ``request_exit``. Its own
    port answers ``/healthz`` and ``/readyz``, so it opens no health port."""

    def __init__(self, state: AppState, server: Any, sockets: list[socket.socket] | None) -> None:
        self.state = state
        self.server = server
        self.sockets = sockets

    def request_exit(self, force: bool = False) -> None:
        """Stop taking requests and finish those in flight (``force``: stop at once)."""
        self.server.request_exit(force)
        self.state.watcher.close()

    async def run(self, stop: asyncio.Event) -> None:
        async def exit_on_stop() -> None:
            await stop.wait()
            self.request_exit()

        stopping = asyncio.create_task(exit_on_stop())
        try:
            await self.server.serve(sockets=self.sockets)
        finally:
            stopping.cancel()

    async def ready(self) -> list[str]:
        from genhook.runtime.services import ready_problems

        return await ready_problems(self.state)

    def release(self) -> None:
        # The supervisor's successor opens the port again: let go of it now.
        log.warning("api: the supervisor is gone; leaving")
        logging.shutdown()
        os._exit(0)


def run_api(settings: Settings) -> None:
    """``genhook api``: HTTP only; workers and dispatchers run elsewhere."""
    _prepare_role(settings, "api")
    api_main(settings)


def release_main(settings: Settings, what: str, owner: str, *, lost: bool) -> None:
    """Entry point of a release process: give back the tasks (``what`` = tasks) or the
    deliveries a dead child ``owner`` held; started by the supervisor, which has no database
    handle of its own."""
    configure_logging(settings, "serve")
    asyncio.run(_release(settings, what, owner, lost=lost))


async def _release(settings: Settings, what: str, owner: str, *, lost: bool) -> None:
    from genhook.db import Database
    from genhook.storage import open_blob_store

    db = Database(settings.resolved_database_url, pool_size=1)
    try:
        await release_held(settings, db, open_blob_store(settings, db), what, owner, lost=lost)
    finally:
        await db.dispose()


async def release_held(
    settings: Settings, db: Database, storage: BlobStore, what: str, owner: str, *, lost: bool
) -> None:
    """Give back the tasks (``what`` = tasks) or the deliveries ``owner`` held."""
    if what == "tasks":
        from genhook.tasks.lifecycle import Lifecycle

        await Lifecycle(settings, db, storage).release_owner(owner, lost=lost)
    else:
        from genhook.sender.queue import release_deliveries

        await release_deliveries(db, owner)
