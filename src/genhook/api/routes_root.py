"""``GET /`` and the site icon: what a browser pointed at the service's address asks for first.

``/`` sends a person to the console (or, with the console off, to the API reference), so
the address ``genhook serve`` prints is never a bare 404. The icon is drawn here, a few
hundred bytes made once, so it needs no file in the package and no image library.
"""

from __future__ import annotations

import functools
import struct
import zlib

from fastapi import APIRouter, Request
from fastapi.responses import RedirectResponse, Response

router = APIRouter(include_in_schema=False)

ICON_SIZE = 32
_BLUE = (37, 99, 235, 255)
_WHITE = (255, 255, 255, 255)
_CLEAR = (0, 0, 0, 0)


@router.get("/")
async def root(request: Request) -> RedirectResponse:
    console = request.app.state.genhook.settings.console_enabled
    return RedirectResponse("/console" if console else "/docs", status_code=307)


@router.get("/favicon.ico")
async def favicon() -> Response:
    return Response(
        icon_ico(),
        media_type="image/vnd.microsoft.icon",
        headers={"Cache-Control": "public, max-age=86400"},
    )


def _pixel(x: int, y: int) -> tuple[int, int, int, int]:
    """A blue disc with a white ring: the service's mark."""
    centre = (ICON_SIZE - 1) / 2
    distance = ((x - centre) ** 2 + (y - centre) ** 2) ** 0.5
    if distance > ICON_SIZE / 2:
        return _CLEAR
    if ICON_SIZE * 0.22 <= distance <= ICON_SIZE * 0.34:
        return _WHITE
    return _BLUE


def _png(size: int) -> bytes:
    def chunk(kind: bytes, data: bytes) -> bytes:
        body = kind + data
        return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))

    rows = b"".join(
        b"\x00" + b"".join(bytes(_pixel(x, y)) for x in range(size)) for y in range(size)
    )
    header = struct.pack(">IIBBBBB", size, size, 8, 6, 0, 0, 0)  # 8-bit RGBA
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(rows, 9))
        + chunk(b"IEND", b"")
    )


@functools.cache
def icon_ico() -> bytes:
    """An ICO file holding one PNG image, the form every current browser reads."""
    png = _png(ICON_SIZE)
    directory = struct.pack("<HHH", 0, 1, 1)
    entry = struct.pack("<BBBBHHII", ICON_SIZE, ICON_SIZE, 0, 0, 1, 32, len(png), 6 + 16)
    return directory + entry + png
