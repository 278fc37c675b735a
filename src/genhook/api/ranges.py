"""HTTP Range requests on outputs (RFC 9110 section 14): browsers seek in a video with them.

One byte range per request is served as 206; a multi-range or malformed header is ignored
(the whole output, 200), as the RFC allows; a range that starts past the end is 416.
"""

from __future__ import annotations

import json
import re

from fastapi import Response

from genhook.api.errors import error_body

# ASCII digits, at most 18 of them (no output is an exabyte): a longer number is a
# malformed range, ignored, rather than work for the interpreter's digit limit.
_RANGE_RE = re.compile(
    r"^\s*bytes\s*=\s*([0-9]{0,18})\s*-\s*([0-9]{0,18})\s*$", re.IGNORECASE | re.ASCII
)


def byte_range(header: str | None, size: int) -> tuple[int, int] | bool | None:
    """(first, last) inclusive; None to serve everything; False when unsatisfiable."""
    if not header:
        return None
    match = _RANGE_RE.match(header)
    if not match or (not match.group(1) and not match.group(2)):
        return None
    first_text, last_text = match.group(1), match.group(2)
    if not first_text:
        suffix = int(last_text)
        if suffix == 0 or size == 0:
            return False
        return max(0, size - suffix), size - 1
    first = int(first_text)
    if last_text and int(last_text) < first:
        return None  # malformed: ignored
    if first >= size:
        return False
    last = int(last_text) if last_text else size - 1
    return first, min(last, size - 1)


def unsatisfiable(size: int) -> Response:
    """416 with the JSON error shape, for a range past the output's end."""
    body = error_body(416, f"the range is outside the output's {size} bytes")
    return Response(
        json.dumps(body),
        status_code=416,
        media_type="application/json",
        headers={"Content-Range": f"bytes */{size}", "Accept-Ranges": "bytes"},
    )


def ranged_response(
    data: bytes, content_type: str, range_header: str | None, headers: dict[str, str]
) -> Response:
    """The whole body (200), one slice of it (206) or 416 with the JSON error shape."""
    headers = {**headers, "Accept-Ranges": "bytes"}
    size = len(data)
    chosen = byte_range(range_header, size)
    if chosen is None:
        return Response(data, media_type=content_type, headers=headers)
    if chosen is False:
        return unsatisfiable(size)
    assert isinstance(chosen, tuple)
    first, last = chosen
    headers["Content-Range"] = f"bytes {first}-{last}/{size}"
    return Response(
        data[first : last + 1], status_code=206, media_type=content_type, headers=headers
    )
