"""``GET /metrics``: Prometheus text exposition (docs/operations.md#metrics).

Open by default, for a scraper on a private network; ``GENHOOK_METRICS_TOKEN`` makes it
ask for that bearer token. Either way it shows counts by model and outcome only, and no
account data unless ``GENHOOK_METRICS_ACCOUNTS`` asks for per-account queue gauges.
"""

from __future__ import annotations

import asyncio
import hmac

from fastapi import APIRouter, Request
from fastapi.responses import Response

from genhook import metrics
from genhook.api.deps import AppState
from genhook.errors import Unauthorized

router = APIRouter()


@router.get(
    "/metrics",
    tags=["operations"],
    summary="Prometheus metrics of this machine",
    response_class=Response,
    responses={
        200: {"content": {"text/plain": {}}, "description": "Prometheus text exposition"},
        401: {"description": "GENHOOK_METRICS_TOKEN is set and the request does not carry it"},
    },
)
async def get_metrics(request: Request) -> Response:
    state: AppState = request.app.state.genhook
    token = state.settings.metrics_token
    if token is not None:
        given = request.headers.get("authorization", "")
        if not hmac.compare_digest(given.encode(), f"Bearer {token}".encode()):
            raise Unauthorized("the metrics token is missing or wrong")
    await metrics.refresh_database_gauges(
        state.db,
        timeout=state.settings.metrics_database_timeout_seconds,
        accounts=state.settings.metrics_accounts,
    )
    # Reading the other processes' files is file I/O: off the loop.
    body, content_type = await asyncio.to_thread(metrics.render)
    return Response(body, media_type=content_type)
