"""Reading a JSON request body under a byte cap, with 400/413 instead of parser crashes."""

from __future__ import annotations

import json
from typing import Any

from fastapi import Request

from genhook.errors import FieldError, InvalidRequest, PayloadTooLarge


async def read_json_body(request: Request, max_bytes: int) -> Any:
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > max_bytes:
        raise PayloadTooLarge(f"the request body is larger than the {max_bytes}-byte limit")
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > max_bytes:
            raise PayloadTooLarge(f"the request body is larger than the {max_bytes}-byte limit")
        chunks.append(chunk)
    raw = b"".join(chunks)
    if not raw:
        raise InvalidRequest(
            "the request body is empty; send a JSON object",
            [FieldError("body", "a JSON object is required")],
        )
    content_type = request.headers.get("content-type", "application/json")
    if "json" not in content_type.split(";")[0].lower():
        raise InvalidRequest(
            "Content-Type must be application/json",
            [FieldError("body", f"unsupported Content-Type {content_type!r}")],
        )
    try:
        return json.loads(raw)
    except UnicodeDecodeError:
        raise InvalidRequest(
            "the request body is not UTF-8", [FieldError("body", "not UTF-8")]
        ) from None
    except (json.JSONDecodeError, RecursionError) as exc:
        detail = (
            f"line {exc.lineno} column {exc.colno}: {exc.msg}"
            if isinstance(exc, json.JSONDecodeError)
            else "nested too deeply"
        )
        raise InvalidRequest(
            "the request body is not valid JSON", [FieldError("body", detail)]
        ) from None
