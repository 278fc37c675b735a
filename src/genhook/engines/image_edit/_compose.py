"""Combining several inputs into one picture: row, column, grid, overlay, blend.

Every composite stays within ``limit`` pixels a side (the output's long side), its sizes
worked out before anything is allocated (``genhook.engines.media.compose``).
"""

from __future__ import annotations

import math

import numpy as np
from PIL import Image

from genhook.engines.image_edit._plan import Step
from genhook.engines.media.compose import bounded_row, cover_crop


def _has_alpha(images: list[Image.Image]) -> bool:
    return any(image.mode == "RGBA" for image in images)


def _canvas(size: tuple[int, int], alpha: bool) -> Image.Image:
    return Image.new("RGBA", size, (0, 0, 0, 0)) if alpha else Image.new("RGB", size, (0, 0, 0))


def _paste(canvas: Image.Image, image: Image.Image, at: tuple[int, int]) -> None:
    if image.mode == "RGBA":
        canvas.paste(image, at, image)
    else:
        canvas.paste(image, at)


def _scaled(image: Image.Image, size: tuple[int, int], fast: bool) -> Image.Image:
    size = (max(1, size[0]), max(1, size[1]))
    return image if image.size == size else image.resize(size, fast)


def row(images: list[Image.Image], limit: int, fast: bool) -> Image.Image:
    """Same height, left to right; the first image sets the height, lowered so the row fits
    ``limit`` both ways."""
    widths, height = bounded_row([im.size for im in images], limit)
    parts = [_scaled(im, (w, height), fast) for im, w in zip(images, widths, strict=True)]
    canvas = _canvas((sum(p.width for p in parts), height), _has_alpha(images))
    x = 0
    for part in parts:
        _paste(canvas, part, (x, 0))
        x += part.width
    return canvas


def column(images: list[Image.Image], limit: int, fast: bool) -> Image.Image:
    """Same width, top to bottom: a row turned on its side."""
    heights, width = bounded_row([(im.height, im.width) for im in images], limit)
    parts = [_scaled(im, (width, h), fast) for im, h in zip(images, heights, strict=True)]
    canvas = _canvas((width, sum(p.height for p in parts)), _has_alpha(images))
    y = 0
    for part in parts:
        _paste(canvas, part, (0, y))
        y += part.height
    return canvas


def grid(images: list[Image.Image], columns: int | None, limit: int, fast: bool) -> Image.Image:
    """Cells the shape of the first image; each image is fitted whole into its cell."""
    cols = max(1, min(columns or math.ceil(math.sqrt(len(images))), len(images)))
    rows = math.ceil(len(images) / cols)
    first = images[0]
    cell_w = max(1, min(first.width, limit // cols))
    cell_h = max(1, round(cell_w * first.height / first.width))
    canvas = _canvas((cell_w * cols, cell_h * rows), _has_alpha(images))
    for index, image in enumerate(images):
        scale = min(cell_w / image.width, cell_h / image.height)
        part = _scaled(image, (round(image.width * scale), round(image.height * scale)), fast)
        x = (index % cols) * cell_w + (cell_w - part.width) // 2
        y = (index // cols) * cell_h + (cell_h - part.height) // 2
        _paste(canvas, part, (x, y))
    return canvas


def overlay(
    base: Image.Image,
    placed: Image.Image,
    position: str,
    scale_percent: float,
    fast: bool,
) -> Image.Image:
    """``placed`` resized to ``scale_percent`` of the base's width, at a named position."""
    width = max(1, round(base.width * min(max(scale_percent, 1.0), 100.0) / 100.0))
    height = max(1, round(placed.height * width / placed.width))
    if height > base.height:
        width = max(1, round(width * base.height / height))
        height = base.height
    part = _scaled(placed, (width, height), fast)
    margin = round(min(base.size) * 0.03)
    vertical, _, horizontal = position.partition("-")
    if position == "center":
        vertical = horizontal = "center"
    x = {
        "left": margin,
        "right": base.width - width - margin,
    }.get(horizontal, (base.width - width) // 2)
    y = {
        "top": margin,
        "bottom": base.height - height - margin,
    }.get(vertical, (base.height - height) // 2)
    out = base.copy()
    _paste(out, part, (max(0, x), max(0, y)))
    return out


def blend(images: list[Image.Image], weight_percent: float | None, fast: bool) -> Image.Image:
    """Weighted mean at the first image's size; a percent is the weight of the last image."""
    size = images[0].size
    if weight_percent is not None and len(images) == 2:
        last = min(max(weight_percent, 0.0), 100.0) / 100.0
        weights = [1.0 - last, last]
    else:
        weights = [1.0 / len(images)] * len(images)
    mode = "RGBA" if _has_alpha(images) else "RGB"
    total = np.zeros((size[1], size[0], len(mode)), np.float32)
    for image, weight in zip(images, weights, strict=True):
        fitted = _cover(image.convert(mode), size, fast)
        total += np.asarray(fitted, dtype=np.float32) * weight
    return Image.fromarray(np.clip(total, 0, 255).astype(np.uint8))


def _cover(image: Image.Image, size: tuple[int, int], fast: bool) -> Image.Image:
    # Cropped before scaling: scaling a 1000x1 picture to cover 1x1000 first would make it
    # 1,000,000 x 1,000.
    return cover_crop(image, size, fast)


def combine(
    step: Step, images: list[Image.Image], limit: int, fast: bool
) -> tuple[Image.Image, list[int]]:
    """Run a combining step; return the picture and the 0-based inputs it used."""
    order = list(step.targets) or list(range(len(images)))
    if step.op == "overlay":
        placed, base = order[0], order[1]
        return (
            overlay(
                images[base],
                images[placed],
                str(step.params.get("position", "center")),
                float(step.params.get("scale_percent", 30.0)),
                fast,
            ),
            [base, placed],
        )
    if len(order) < 2:
        order = list(range(len(images)))
    chosen = [images[i] for i in order]
    if step.op == "side_by_side":
        return row(chosen, limit, fast), order
    if step.op == "stack_vertical":
        return column(chosen, limit, fast), order
    if step.op == "grid":
        columns = step.params.get("columns")
        return grid(chosen, int(columns) if columns else None, limit, fast), order
    weight = step.params.get("weight_percent")
    return blend(chosen, float(weight) if weight is not None else None, fast), order
