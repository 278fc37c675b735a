"""Several input pictures made into one, with every size worked out before any pixel is
allocated.

A row (or column) puts its inputs at one common height (width). Scaling each input to the
first one's height alone is unbounded: a 1x1000 picture followed by a 1000x1 one would need
a 1,000,000 x 1,000 canvas, 3 GB, from 268 bytes of PNG. Here the common side is chosen so
that the whole composite fits ``max_side`` in both directions; every intermediate (each
scaled input) is smaller than the composite. The pixel budget counts what the inputs
declare; this bound covers what is derived from them.
"""

from __future__ import annotations

from collections.abc import Sequence

from PIL import Image

from genhook.engines.media.output import resize


def row_height(sizes: Sequence[tuple[int, int]], max_side: int) -> int:
    """The common height of ``sizes`` (width, height) laid left to right: the first one's
    height, lowered until the row is at most ``max_side`` wide and high (at least 1)."""
    aspects = sum(width / height for width, height in sizes)
    height = min(sizes[0][1], max_side, int(max_side / aspects))
    return max(1, height)


def row_widths(sizes: Sequence[tuple[int, int]], height: int) -> list[int]:
    """Each input's width at ``height``, its aspect ratio kept (at least 1 pixel)."""
    return [max(1, round(width * height / h)) for width, h in sizes]


def bounded_row(sizes: Sequence[tuple[int, int]], max_side: int) -> tuple[list[int], int]:
    """Widths and the common height of a row of ``sizes`` within ``max_side``; the widths'
    sum may pass ``max_side`` by the rounding of each, at most one pixel per input."""
    height = row_height(sizes, max_side)
    return row_widths(sizes, height), height


def side_by_side(images: list[Image.Image], max_side: int, fast: bool = False) -> Image.Image:
    """``images`` left to right at a common height, within ``max_side`` (RGB)."""
    if len(images) == 1 and max(images[0].size) <= max_side:
        return images[0].convert("RGB")
    widths, height = bounded_row([image.size for image in images], max_side)
    canvas = Image.new("RGB", (sum(widths), height))
    left = 0
    for image, width in zip(images, widths, strict=True):
        canvas.paste(resize(image, (width, height), fast).convert("RGB"), (left, 0))
        left += width
    return canvas


def cover_crop(image: Image.Image, size: tuple[int, int], fast: bool) -> Image.Image:
    """``image`` filling ``size`` (scaled, the middle kept): the crop is taken in the source's
    own pixels first, so nothing larger than ``size`` or the source is ever made."""
    width, height = size
    scale = max(width / image.width, height / image.height)
    crop_w = min(image.width, max(1, round(width / scale)))
    crop_h = min(image.height, max(1, round(height / scale)))
    left = (image.width - crop_w) // 2
    top = (image.height - crop_h) // 2
    return resize(image.crop((left, top, left + crop_w, top + crop_h)), size, fast)
