"""What the worker and dispatcher roles run besides their main loop.

The API answers ``/healthz`` and ``/readyz`` on its own port. A worker or a dispatcher has
no HTTP server of its own, so each may open a small health port (``GENHOOK_HEALTH_PORT``)
for an orchestrator's probes and a metrics scraper. The dispatcher role also owns the
task sweeper (expired leases, overdue tasks): the API runs no background writer.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING

from genhook.config import Settings
from genhook.faults import is_infrastructure_error
from genhook.logs import FOLD
from genhook.services import Services
from genhook.tasks.lifecycle import Lifecycle

if TYPE_CHECKING:
    # Imported where used: a worker imports this module for its health port, and needs
    # neither aiohttp's server (unless it opens one) nor the webhook sender.
    from aiohttp import web

log = logging.getLogger(__name__)

ReadyCheck = Callable[[], Awaitable[list[str]]]


class HealthPort:
    """``/healthz`` (the process answers), ``/readyz`` (``ready`` finds no problem) and
    ``/metrics`` (Prometheus text) on their own listener, apart from the role's work."""

    def __init__(self, host: str, port: int, ready: ReadyCheck) -> None:
        self.host = host
        self.port = port
        self._ready = ready
        self._runner: web.AppRunner | None = None

    async def start(self) -> int:
        """Listen; returns the bound port (the one asked for, or an ephemeral one for 0)."""
        from aiohttp import web

        app = web.Application()
        app.router.add_get("/healthz", self._healthz)
        app.router.add_get("/readyz", self._readyz)
        app.router.add_get("/metrics", self._metrics)
        runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await runner.setup()
        site = web.TCPSite(runner, self.host, self.port)
        await site.start()
        self._runner = runner
        # asyncio's and uvloop's servers both list their sockets.
        sockets = getattr(site._server, "sockets", None) or ()
        for sock in sockets:
            self.port = int(sock.getsockname()[1])
        return self.port

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def _healthz(self, _: web.Request) -> web.Response:
        from aiohttp import web

        return web.json_response({"status": "ok"})

    async def _readyz(self, _: web.Request) -> web.Response:
        from aiohttp import web

        try:
            problems = await self._ready()
        except Exception as exc:
            problems = [f"{type(exc).__name__}: {exc}"]
        if problems:
            message = "; ".join(problems)
            log.warning("readiness check failed: %s", message, extra=FOLD)
            return web.json_response({"code": 503, "message": message, "errors": []}, status=503)
        return web.json_response({"status": "ready"})

    async def _metrics(self, _: web.Request) -> web.Response:
        from aiohttp import web

        from genhook import metrics

        body, content_type = await asyncio.to_thread(metrics.render)
        return web.Response(body=body, headers={"Content-Type": content_type})


@contextlib.asynccontextmanager
async def health_port(settings: Settings, ready: ReadyCheck) -> AsyncIterator[None]:
    """The role's health port while the block runs; none when ``health_port`` is 0."""
    if not settings.health_port:
        yield
        return
    port = HealthPort(settings.health_host, settings.health_port, ready)
    bound = await port.start()
    log.info("health port listening on %s:%d", settings.health_host, bound)
    try:
        yield
    finally:
        await port.close()


async def sweep_forever(lifecycle: Lifecycle, interval: float, stop: asyncio.Event) -> None:
    """Expire leases of vanished workers and end overdue tasks, every ``interval``."""
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

    @property
    def started(self) -> bool:
        dispatcher = self.webhooks.dispatcher
        return dispatcher is not None and dispatcher.started.is_set()

    async def run(self, stop: asyncio.Event) -> None:
        interval = self.state.settings.sweep_interval_seconds
        sweeper = asyncio.create_task(sweep_forever(self.lifecycle, interval, stop))
        try:
            await self.webhooks.run(stop)
        finally:
            stop.set()
            await asyncio.gather(sweeper, return_exceptions=True)
