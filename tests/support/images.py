"""Images drawn in code, for requests."""

from __future__ import annotations

import base64
import io

from PIL import Image


def image_bytes(
    colour: tuple[int, int, int] = (200, 30, 30), fmt: str = "PNG", size: int = 32
) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (size, size), colour).save(buffer, fmt)
    return buffer.getvalue()


def data_url(colour: tuple[int, int, int] = (200, 30, 30), fmt: str = "PNG", size: int = 32) -> str:
    mime = {"PNG": "image/png", "JPEG": "image/jpeg", "WEBP": "image/webp"}.get(fmt, "image/png")
    return f"data:{mime};base64," + base64.b64encode(image_bytes(colour, fmt, size)).decode()
