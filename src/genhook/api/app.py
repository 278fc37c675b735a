"""The FastAPI application factory.

``create_app`` builds the app around an ``AppState``. An API process answers HTTP and runs
no background writer: webhook delivery and the lease/deadline sweeper are the dispatcher
role's (``genhook.runtime.roles``), so API replicas add request capacity and nothing else.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI
from fastapi.responses import JSONResponse

from genhook import __version__, tracing
from genhook.api.deps import AppState
from genhook.api.errors import install_error_handlers
from genhook.api.routes_admin import router as admin_router
from genhook.api.routes_cancel import router as cancel_router
from genhook.api.routes_delivery_message import router as delivery_message_router
from genhook.api.routes_docs import install_docs
from genhook.api.routes_keys import router as keys_router
from genhook.api.routes_metrics import router as metrics_router
from genhook.api.routes_models import install_models
from genhook.api.routes_queue import router as queue_router
from genhook.api.routes_root import router as root_router
from genhook.api.routes_signing_keys import router as signing_keys_router
from genhook.api.routes_tasks import router as tasks_router
from genhook.api.routes_timeline import router as timeline_router
from genhook.api.routes_upstream import router as upstream_router
from genhook.api.routes_watch import router as watch_router
from genhook.api.routes_webhooks import router as webhooks_router
from genhook.api.shedding import LoadShedding, ready_problems
from genhook.config import Settings
from genhook.console import install_console
from genhook.db import Database
from genhook.engines.registry import Registry
from genhook.faults import RETRY_AFTER_SECONDS
from genhook.logs import FOLD
from genhook.net import Resolver
from genhook.runtime.services import open_services
from genhook.storage.blobs import close_blob_store

log = logging.getLogger(__name__)


def build_state(
    settings: Settings,
    *,
    registry: Registry | None = None,
    resolver: Resolver | None = None,
    db: Database | None = None,
) -> AppState:
    return AppState.sharing(open_services(settings, registry=registry, resolver=resolver, db=db))


def create_app(state: AppState) -> FastAPI:
    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        try:
            yield
        finally:
            await close_blob_store(state.storage)
            await state.db.dispose()

    app = FastAPI(
        title="genhook",
        version=__version__,
        description="Asynchronous generation tasks with signed webhook callbacks.",
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
        **tracing.fastapi_options(),
    )
    app.state.genhook = state
    install_error_handlers(app)
    app.add_middleware(LoadShedding, limit=state.settings.max_concurrent_requests)
    tracing.instrument_app(app)
    if state.settings.trusted_proxies:
        # Outermost, so everything after it sees the client a trusted proxy forwarded for;
        # uvicorn's own copy is off (roles.py), which trusted loopback by default.
        from uvicorn.middleware.proxy_headers import ProxyHeadersMiddleware

        app.add_middleware(ProxyHeadersMiddleware, trusted_hosts=state.settings.trusted_proxies)
    app.include_router(tasks_router)
    app.include_router(cancel_router)
    app.include_router(webhooks_router)
    app.include_router(watch_router)
    install_models(app, state.registry)
    app.include_router(upstream_router)
    app.include_router(keys_router)
    app.include_router(admin_router)
    app.include_router(queue_router)
    app.include_router(delivery_message_router)
    app.include_router(timeline_router)
    app.include_router(signing_keys_router)
    app.include_router(metrics_router)
    app.include_router(root_router)
    if state.settings.console_enabled:
        install_console(app, state)
    if state.settings.api_docs:
        install_docs(app)

    @app.get("/healthz", tags=["operations"], summary="Liveness: the process answers")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get(
        "/readyz",
        tags=["operations"],
        summary="Readiness: the database and the data directory can be written",
    )
    async def readyz() -> Any:
        problems = await ready_problems(state)
        if problems:
            log.warning("readiness check failed: %s", "; ".join(problems), extra=FOLD)
            return JSONResponse(
                {"code": 503, "message": "; ".join(problems), "errors": []},
                status_code=503,
                headers={"Retry-After": str(RETRY_AFTER_SECONDS)},
            )
        return {"status": "ready"}

    return app
