"""A production-shaped genhook webhook receiver with FastAPI.

It verifies every delivery (Ed25519 via the service's JWKS, HMAC as a fallback during the
migration), deduplicates on ``session_id`` in SQLite, answers within milliseconds and does
the real work in the background, so the service is answered within seconds.

    pip install genhook fastapi uvicorn
    export GENHOOK_BASE_URL=https://genhook.example.com   # where the JWKS is served
    export GENHOOK_SIGNING_SECRET=whsec_...               # optional, legacy HMAC
    uvicorn examples.fastapi_receiver:app --port 8080
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import Depends, FastAPI

from genhook.receiver import SQLiteDedupStore, WebhookEvent, WebhookVerifier, webhook_dependency

log = logging.getLogger("receiver")

BASE_URL = os.environ.get("GENHOOK_BASE_URL", "http://127.0.0.1:8000").rstrip("/")
verifier = WebhookVerifier(
    jwks_url=f"{BASE_URL}/api/v1/webhooks/jwks.json",
    hmac_secret=os.environ.get("GENHOOK_SIGNING_SECRET"),
    brand=os.environ.get("GENHOOK_WEBHOOK_HEADER_BRAND", "Service"),
)
dedup = SQLiteDedupStore(os.environ.get("RECEIVER_DEDUP_DB", "genhook-seen.db"))
queue: asyncio.Queue[WebhookEvent] = asyncio.Queue()


async def process(event: WebhookEvent) -> None:
    """Your business logic: runs after the delivery was acknowledged."""
    if event.ok:
        log.info("task %s completed: %s", event.session_id, event.payload.outputs)
    else:
        log.warning(
            "task %s %s (error_code %s): %s",
            event.session_id,
            event.payload.status,
            event.payload.error_code,
            event.error,
        )


async def worker() -> None:
    while True:
        event = await queue.get()
        try:
            await process(event)
        except Exception:
            log.exception("processing %s failed; a redelivery will be processed", event.session_id)
            dedup.forget(event.session_id)
        finally:
            queue.task_done()


@asynccontextmanager
async def lifespan(_: FastAPI) -> AsyncIterator[None]:
    task = asyncio.create_task(worker())
    yield
    await queue.join()
    task.cancel()


app = FastAPI(lifespan=lifespan)


@app.post("/hooks/genhook")
async def genhook_webhook(
    event: WebhookEvent = Depends(webhook_dependency(verifier)),
) -> dict[str, str]:
    # A bad signature never gets here: the dependency answers 400 with the reason.
    if not dedup.first_time(event.session_id):
        return {"status": "duplicate"}  # 200: the service stops retrying
    queue.put_nowait(event)
    return {"status": "accepted"}
