"""Input decoding: bytes in, an RGB or RGBA picture out, or a documented ``TaskFailure``.

Hostile input must never take a worker down, so the declared pixel count is checked from the
header before any pixel is decoded, Pillow is only allowed the one decoder the magic bytes
name, and every decoder error becomes ``INPUT_CORRUPT``.
"""

from __future__ import annotations

import io
import logging
import struct
from dataclasses import dataclass

import numpy as np
from PIL import Image, ImageOps, UnidentifiedImageError

from genhook.errors import ErrorCode, TaskFailure
from genhook.media import (
    ACCEPTED_FORMATS,
    PIL_FORMATS,
    DecodeLimits,
    aspect_problem,
    decode_cost_problem,
    pixel_budget_problem,
    register_heif,
    sniff_image_format,
)

log = logging.getLogger(__name__)

_DECODER_ERRORS = (
    OSError,
    SyntaxError,
    ValueError,
    struct.error,
    EOFError,
    IndexError,
    KeyError,
    TypeError,
    ZeroDivisionError,
    RuntimeError,
    UnidentifiedImageError,
)


@dataclass(frozen=True, slots=True)
class DecodedImage:
    image: Image.Image  # mode RGB or RGBA
    format: str
    width: int  # as stored, before EXIF orientation and any reduction
    height: int
    animated: bool  # more than one frame or page; only the first is used


def decode_image(
    data: bytes,
    number: int,
    *,
    max_pixels: int,
    reduce_to: int | None = None,
    limits: DecodeLimits | None = None,
) -> DecodedImage:
    """Decode input ``number`` (1-based, for messages).

    ``limits`` bounds decode work beyond the pixel count (scans, chunks); see
    ``genhook.media.DecodeLimits``.

    ``reduce_to`` lets JPEG decode at a DCT-reduced scale when the picture is far larger
    than the output needs, which costs nothing in quality after the final resize.
    """
    fmt = sniff_image_format(data)
    if fmt is None:
        head = data[:8].hex(" ")
        raise TaskFailure(
            ErrorCode.INPUT_UNSUPPORTED_FORMAT,
            f"image {number} is not one of {', '.join(f.upper() for f in ACCEPTED_FORMATS)} "
            f"(its first bytes are {head or 'empty'})",
        )
    problem = decode_cost_problem(data, fmt, limits or DecodeLimits(max_pixels))
    if problem is not None:
        raise TaskFailure(
            ErrorCode.INPUT_TOO_COSTLY,
            f"image {number} ({fmt.upper()}) {problem} (refused before decoding)",
        )
    if fmt in ("heic", "heif"):
        register_heif()
    try:
        image = Image.open(io.BytesIO(data), formats=[PIL_FORMATS[fmt]])
    except Image.DecompressionBombError:
        raise _too_many(number, None, max_pixels) from None
    except _DECODER_ERRORS as exc:
        raise TaskFailure(
            ErrorCode.INPUT_CORRUPT, f"image {number} ({fmt.upper()}) cannot be read: {_why(exc)}"
        ) from None
    width, height = image.size
    if width <= 0 or height <= 0:
        raise TaskFailure(ErrorCode.INPUT_CORRUPT, f"image {number} declares an empty size")
    if width * height > max_pixels:
        raise _too_many(number, (width, height), max_pixels)
    shape = aspect_problem((width, height))
    if shape is not None:  # an input fetched from a URL is first seen here
        raise TaskFailure(ErrorCode.INPUT_TOO_COSTLY, f"image {number} {shape}")
    try:
        # ``is_animated`` looks at most one frame ahead; ``n_frames`` would walk (and for GIF
        # decode) every frame, a cost a hostile file could multiply.
        animated = bool(getattr(image, "is_animated", False))
        if animated:
            image.seek(0)
        if reduce_to and fmt == "jpeg" and max(width, height) > 2 * reduce_to:
            image.draft(None, (reduce_to, reduce_to))
        image.load()
        oriented: Image.Image = image
        try:
            oriented = ImageOps.exif_transpose(image)
        except _DECODER_ERRORS as exc:  # a broken EXIF block is no reason to refuse a picture
            log.info("image %d: ignoring unreadable EXIF orientation: %s", number, exc)
        normalized = normalize_mode(oriented)
    except Image.DecompressionBombError:
        raise _too_many(number, (width, height), max_pixels) from None
    except MemoryError:
        raise TaskFailure(
            ErrorCode.INPUT_TOO_MANY_PIXELS, f"image {number} needs more memory than available"
        ) from None
    except _DECODER_ERRORS as exc:
        raise TaskFailure(
            ErrorCode.INPUT_CORRUPT,
            f"image {number} ({fmt.upper()}) is truncated or corrupt: {_why(exc)}",
        ) from None
    return DecodedImage(normalized, fmt, width, height, animated)


def check_pixel_budget(images: list[bytes], budget: int) -> None:
    """Refuse a task whose inputs declare more than ``budget`` pixels together, before any
    is decoded (images fetched from URLs are first seen here)."""
    problem = pixel_budget_problem(list(images), budget)
    if problem is not None:
        raise TaskFailure(ErrorCode.INPUT_TOO_MANY_PIXELS, f"{problem} (refused before decoding)")


def _why(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text[:200]


def _too_many(number: int, size: tuple[int, int] | None, max_pixels: int) -> TaskFailure:
    declared = f" declares {size[0]}×{size[1]} = {size[0] * size[1]:,} pixels" if size else ""
    return TaskFailure(
        ErrorCode.INPUT_TOO_MANY_PIXELS,
        f"image {number}{declared or ' declares too many pixels'}; the limit is "
        f"{max_pixels:,} pixels (refused before decoding)",
    )


def normalize_mode(image: Image.Image) -> Image.Image:
    """Bring any Pillow mode to RGB, or RGBA when the picture has transparency."""
    mode = image.mode
    if mode in ("RGB", "RGBA"):
        return image
    if mode in ("I;16", "I;16B", "I;16L", "I;16N", "I", "F"):
        array = np.asarray(image, dtype=np.float64)
        top = float(array.max()) if array.size else 0.0
        if mode == "F" and top <= 1.0:
            array = array * 255.0
        elif top > 255.0:
            array = array / (65535.0 if top <= 65535.0 else top) * 255.0
        gray = np.clip(array, 0, 255).astype(np.uint8)
        return Image.fromarray(gray).convert("RGB")
    if mode == "P":
        has_alpha = "transparency" in image.info or (
            image.palette is not None and (image.palette.mode == "RGBA")
        )
        return image.convert("RGBA" if has_alpha else "RGB")
    if mode in ("LA", "PA", "La", "RGBa"):
        return image.convert("RGBA")
    if mode in ("L", "1") and "transparency" in image.info:
        return image.convert("RGBA")
    return image.convert("RGB")
