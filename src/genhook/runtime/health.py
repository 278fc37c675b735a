"""The health port a worker or a dispatcher runs besides its main loop.

The API answers ``/healthz`` and ``/readyz`` on its own port. A worker or a dispatcher has
no HTTP server of its own, so each may open a small health port (``GENHOOK_HEALTH_PORT``)
for an orchestrator's probes and a metrics scraper.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING

from genhook.config import Settings
from genhook.logs import FOLD

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
