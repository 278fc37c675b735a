"""Turn what a caller has at hand into ``images`` items the service accepts.

URLs and data URLs pass through untouched; local files, bytes and PIL images become base64
data URLs. PIL is duck-typed (anything with ``save(fp, format=...)``), so the SDK never
imports it. The MIME type comes from the bytes, never from a file name; the service
validates the bytes again, so this module adds no rules of its own.
"""

from __future__ import annotations

import base64
import io
import mimetypes
import os
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Protocol, TypeAlias, runtime_checkable

from genhook.media import CONTENT_TYPES, sniff_image_format


@runtime_checkable
class SavableImage(Protocol):
    """The part of ``PIL.Image.Image`` the SDK uses."""

    def save(self, fp: Any, format: str | None = None, **params: Any) -> None: ...


ImageInput: TypeAlias = str | os.PathLike[str] | bytes | bytearray | memoryview | SavableImage
"""A URL, a data URL, a local file path, raw image bytes, or a PIL image."""

# Anything URL-shaped passes through, even a scheme the service refuses: the service's
# answer names the item (``images[2]``) and says why.
_URL_RE = re.compile(r"^(?:[a-zA-Z][a-zA-Z0-9+.-]*://|data:)")


def data_url(data: bytes, name: str | None = None) -> str:
    """A base64 data URL whose MIME type is sniffed from ``data`` (an image), else guessed
    from the file ``name`` (the service reads the bytes either way)."""
    fmt = sniff_image_format(data)
    guessed = mimetypes.guess_type(name)[0] if name else None
    mime = CONTENT_TYPES[fmt] if fmt else guessed or "application/octet-stream"
    return f"data:{mime};base64,{base64.b64encode(data).decode('ascii')}"


def is_url(value: str) -> bool:
    """Whether ``value`` is URL-shaped (a scheme or a data URL) rather than a file path."""
    return _URL_RE.match(value) is not None


def file_item(value: str | os.PathLike[str]) -> str:
    """A URL or data URL unchanged, else the file at that path as a data URL: any media,
    an audio file to transcribe as well as an image."""
    if isinstance(value, str) and is_url(value):
        return value
    path = Path(value).expanduser()
    return data_url(path.read_bytes(), path.name)


def image_item(value: ImageInput) -> str:
    """Convert one input to an ``images`` item; raise FileNotFoundError for a missing path."""
    if isinstance(value, str):
        if _URL_RE.match(value):
            return value
        return data_url(Path(value).expanduser().read_bytes())
    if isinstance(value, os.PathLike):
        return data_url(Path(value).expanduser().read_bytes())
    if isinstance(value, bytes | bytearray | memoryview):
        return data_url(bytes(value))
    if isinstance(value, SavableImage):
        buffer = io.BytesIO()
        # PNG is lossless and keeps alpha, so the service sees exactly the caller's pixels.
        value.save(buffer, format="PNG")
        return data_url(buffer.getvalue())
    raise TypeError(f"unsupported image input of type {type(value).__name__}")


def image_items(images: ImageInput | Iterable[ImageInput]) -> list[str]:
    """Accept one input or an iterable of them."""
    if isinstance(images, str | bytes | bytearray | memoryview | os.PathLike | SavableImage):
        return [image_item(images)]
    return [image_item(item) for item in images]


# Request fields that take media: ``images``, ``audio``, a ``video``, a ``style_image``...
MEDIA_WORDS = ("image", "audio", "video")


def is_media_field(name: str) -> bool:
    """Whether the request field ``name`` takes a media file (by the words in its name)."""
    return any(word in name for word in MEDIA_WORDS)


def media_value(value: Any) -> Any:
    """One media field's value as the service takes it: a ``Path``, bytes or a PIL image
    become a data URL, and so does a string naming an existing local file; URLs, data URLs
    and other values pass through (the service says what is wrong with them). A list is
    converted item by item."""
    if isinstance(value, list | tuple):
        return [media_value(item) for item in value]
    if isinstance(value, str):
        if is_url(value):
            return value
        path = Path(value).expanduser()
        return data_url(path.read_bytes(), path.name) if path.is_file() else value
    if isinstance(value, os.PathLike):
        return file_item(value)
    if isinstance(value, bytes | bytearray | memoryview | SavableImage):
        return image_item(value)
    return value


def media_fields(fields: dict[str, Any]) -> dict[str, Any]:
    """``fields`` with every media field's local files read (see ``media_value``); ``images``
    is read as ``edit()`` reads it, one input or a list of them. A ``Path``, bytes or a PIL
    image is a file whatever the field's name (a model of your own may call it anything)."""
    return {
        k: image_items(v)
        if k == "images"
        else media_value(v)
        if is_media_field(k) or _is_file(v)
        else v
        for k, v in fields.items()
    }


def _is_file(value: Any) -> bool:
    """A value that can only mean a file: a ``Path``, bytes or a PIL image (or a list)."""
    if isinstance(value, list | tuple):
        return bool(value) and all(_is_file(item) for item in value)
    return isinstance(value, os.PathLike | bytes | bytearray | memoryview | SavableImage)
