"""Outputs kept in a bucket: streamed through the API in chunks (with Range support), or
answered with a redirect to a short-lived presigned URL (``GENHOOK_OUTPUT_DELIVERY``).

Either way the key is checked first (it is the credential) and an output deleted by
retention answers 410, as for the other blob stores.
"""

from __future__ import annotations

from fastapi import Request, Response
from fastapi.responses import RedirectResponse, StreamingResponse

from genhook.api.ranges import byte_range, unsatisfiable
from genhook.config import Settings
from genhook.db import Database
from genhook.errors import NotFound
from genhook.storage.blobs import BucketBlobStore
from genhook.tasks.retention import raise_if_expired

CACHE_HEADERS = {"Cache-Control": "private, max-age=31536000, immutable"}


async def bucket_output(
    store: BucketBlobStore, settings: Settings, db: Database, key: str, request: Request
) -> Response:
    info = await store.info(key)
    if info is None:
        await raise_if_expired(db, key)
        raise NotFound("no such output")
    # The console's own pages (same origin) are streamed to: their Content-Security-Policy
    # admits this origin only, and a redirect to the bucket would break their players.
    same_origin = request.headers.get("sec-fetch-site") == "same-origin"
    if settings.output_delivery == "redirect" and not same_origin:
        # The URL expires, so neither the redirect nor its target may be cached for long.
        headers = {"Cache-Control": "private, no-store"}
        return RedirectResponse(await store.presigned_url(key), 307, headers=headers)
    headers = {**CACHE_HEADERS, "Accept-Ranges": "bytes"}
    if info.size == 0:
        return Response(b"", media_type=info.content_type, headers=headers)
    chosen = byte_range(request.headers.get("range"), info.size)
    if chosen is False:
        return unsatisfiable(info.size)
    status = 200
    first, last = 0, info.size - 1
    if isinstance(chosen, tuple):
        status = 206
        first, last = chosen
        headers["Content-Range"] = f"bytes {first}-{last}/{info.size}"
    headers["Content-Length"] = str(last - first + 1)
    chunks = await store.open_range(key, first, last)
    return StreamingResponse(
        chunks, status_code=status, media_type=info.content_type, headers=headers
    )
