"""The edit engine's looks, offered to engines that turn stills into frames (the video model).

A prompt's looks (black and white, cartoon, caption, border, ...) are read and applied by
the edit engine's own parser and operations; this module only splits a plan into what
applies once per input picture and what is drawn over every frame at output resolution.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt
from PIL import Image, ImageDraw

from genhook.engines.image_edit._ops import Context
from genhook.engines.image_edit._parser import parse_prompt
from genhook.engines.image_edit._plan import COMBINE_OPS, FINISHING_OPS, EditPlan, Step
from genhook.engines.media import output as _output
from genhook.errors import ErrorCode, TaskFailure

Array = npt.NDArray[Any]


@dataclass(slots=True)
class Looks:
    """A prompt's looks: per-picture steps, over-frame steps, and what was not used."""

    plan: EditPlan | None
    per_image: list[Step] = field(default_factory=list)
    finishing: list[Step] = field(default_factory=list)
    unused: list[Step] = field(default_factory=list)
    ignored: list[str] = field(default_factory=list)

    def describe(self) -> list[dict[str, Any]]:
        return [step.describe() for step in [*self.per_image, *self.finishing]]


def read_looks(text: str, image_count: int) -> Looks:
    """Read ``text`` with the edit parser; text naming no look yields no looks, not a failure.

    Combinations (side by side, grid, ...) have no meaning for a frame sequence and are
    returned as ``unused``; every other failure of the parser (an instruction naming image
    3 of two) is the caller's failure too.
    """
    if not any(ch.isalpha() for ch in text):
        return Looks(plan=None)
    try:
        plan = parse_prompt(text, image_count, loose=True)
    except TaskFailure as failure:
        if failure.code != ErrorCode.PROMPT_NOT_UNDERSTOOD:
            raise
        return Looks(plan=None, ignored=[text.strip(" ,.;")])
    looks = Looks(plan=plan, ignored=list(plan.ignored))
    for step in plan.steps:
        if step.op in COMBINE_OPS:
            looks.unused.append(step)
        elif step.op in FINISHING_OPS and not step.targets:
            looks.finishing.append(step)
        else:
            looks.per_image.append(step)
    return looks


def apply_looks(looks: Looks, image: Image.Image, index: int, ctx: Context) -> Image.Image:
    """Apply the per-picture steps meant for input ``index`` (0-based), in prompt order."""
    from genhook.engines.image_edit._engine import apply_to_input

    for step in looks.per_image:
        if not step.targets or index in step.targets:
            image = apply_to_input(step, image, ctx)
    return image


@dataclass(slots=True)
class Decor:
    """Borders and captions, drawn once at output size, for laying over every frame.

    The moving picture has size ``inner`` and sits at ``offset`` (x, y) inside ``frame``, the
    border drawn around it (None without a border); ``caption_rgb`` and ``caption_alpha`` are
    the caption's pixels in ``caption_box`` (x0, y0, x1, y1) of the moving picture. Offsets
    and box corners are even, so the layers stay aligned with yuv420p's 2x2 chroma blocks.
    """

    size: tuple[int, int]
    inner: tuple[int, int]
    offset: tuple[int, int]
    frame: Array | None
    caption_box: tuple[int, int, int, int] | None = None
    caption_rgb: Array | None = None
    caption_alpha: Array | None = None


def _even_inside(low: int, high: int, limit: int) -> tuple[int, int]:
    low -= low % 2
    high += high % 2
    return max(0, low), min(limit, high)


def build_decor(finishing: list[Step], size: tuple[int, int]) -> Decor:
    """Lay out the over-frame steps the way the edit engine's finishing stage does."""
    borders = [
        (_output.border_width(s.params, size), str(s.params["color"]))
        for s in finishing
        if s.op == "border"
    ]
    total = sum(width for width, _ in borders)
    inner_list = []
    for side in size:
        pad = side - max(16, side - 2 * total)
        pad = (pad + 3) // 4 * 4  # an even offset on each side
        inner_list.append(side - pad)
    inner = (inner_list[0], inner_list[1])
    offset = ((size[0] - inner[0]) // 2, (size[1] - inner[1]) // 2)
    decor = Decor(size=size, inner=inner, offset=offset, frame=None)
    if borders:
        # The first border named is the innermost, as in the edit engine; draw from the
        # outside in, the innermost taking whatever rounding leaves up to the picture.
        kept: list[tuple[int, str]] = []
        left = min(offset)
        for width, color in borders:
            width = min(width, left)
            if width > 0:
                kept.append((width, color))
                left -= width
        canvas = Image.new("RGB", size, (0, 0, 0))
        draw = ImageDraw.Draw(canvas)
        inset = 0
        for width, color in reversed(kept):
            draw.rectangle(
                (inset, inset, size[0] - 1 - inset, size[1] - 1 - inset), fill=_output.rgb(color)
            )
            inset += width
        decor.frame = np.array(canvas, dtype=np.uint8)
    layer = Image.new("RGBA", inner, (0, 0, 0, 0))
    for step in finishing:
        if step.op == "caption":
            layer = _output.caption(layer, step.params)
    alpha = np.asarray(layer.getchannel("A"))
    if alpha.any():
        ys, xs = np.nonzero(alpha)
        x0, x1 = _even_inside(int(xs.min()), int(xs.max()) + 1, inner[0])
        y0, y1 = _even_inside(int(ys.min()), int(ys.max()) + 1, inner[1])
        rgba = np.asarray(layer, dtype=np.float32)[y0:y1, x0:x1]
        decor.caption_box = (x0, y0, x1, y1)
        decor.caption_rgb = rgba[:, :, :3]
        decor.caption_alpha = rgba[:, :, 3:] / 255.0
    return decor
