"""Frames as yuv420p (I420) from the start: the camera resizes the planes the encoder takes.

Working in the encoder's own format halves the bytes each frame's resize touches (1.5 per
pixel instead of 3) and leaves no colour conversion per frame. Every x and y offset and size
is even, so a picture's chroma stays aligned with its 2x2 luma blocks. OpenCV's I420 is
BT.601 limited range (black is Y 16, U and V 128), which the encoder is told.
"""

from __future__ import annotations

import math
from typing import Any

import cv2
import numpy as np
import numpy.typing as npt

from genhook.engines.image_edit import Decor
from genhook.engines.image_to_video._camera import View, ease

Array = npt.NDArray[Any]
BLACK_Y = 16
NEUTRAL_C = 128


class I420:
    """One picture's Y, U and V planes in one contiguous buffer, laid out as PyAV and OpenCV
    expect (``buf`` has shape height * 3/2 by width)."""

    __slots__ = ("buf", "height", "u", "v", "width", "y")

    def __init__(self, width: int, height: int, buf: Array | None = None) -> None:
        self.width, self.height = width, height
        self.buf = buf if buf is not None else np.empty((height * 3 // 2, width), np.uint8)
        flat = self.buf.reshape(-1)
        luma = width * height
        quarter = luma // 4
        self.y = flat[:luma].reshape(height, width)
        self.u = flat[luma : luma + quarter].reshape(height // 2, width // 2)
        self.v = flat[luma + quarter : luma + 2 * quarter].reshape(height // 2, width // 2)

    @classmethod
    def from_rgb(cls, rgb: Array) -> I420:
        height, width = rgb.shape[:2]
        return cls(width, height, np.asarray(cv2.cvtColor(rgb, cv2.COLOR_RGB2YUV_I420)))

    def to_rgb(self) -> Array:
        rgb: Array = cv2.cvtColor(self.buf, cv2.COLOR_YUV2RGB_I420)
        return rgb

    @property
    def planes(self) -> tuple[Array, Array, Array]:
        return self.y, self.u, self.v

    @property
    def size(self) -> tuple[int, int]:
        return self.width, self.height


def _even(value: float) -> int:
    return 2 * round(value / 2)


def render(still: I420, view: View, size: tuple[int, int]) -> I420:
    """The frame of ``size`` that ``view`` sees in ``still``."""
    out = I420(*size)
    width, height = still.size
    out_w, out_h = size
    win_w, win_h = width / view.zoom, height / view.zoom
    if view.angle == 0.0:
        # Upright: an even crop and one resize per plane, several times cheaper than a warp.
        x0 = max(0, _even(view.cx - win_w / 2))
        y0 = max(0, _even(view.cy - win_h / 2))
        x1 = min(width, x0 + max(2, _even(win_w)))
        y1 = min(height, y0 + max(2, _even(win_h)))
        interpolation = cv2.INTER_AREA if (x1 - x0) > 1.5 * out_w else cv2.INTER_LINEAR
        cv2.resize(still.y[y0:y1, x0:x1], size, dst=out.y, interpolation=interpolation)
        half = (out_w // 2, out_h // 2)
        box = (slice(y0 // 2, y1 // 2), slice(x0 // 2, x1 // 2))
        cv2.resize(still.u[box], half, dst=out.u, interpolation=interpolation)
        cv2.resize(still.v[box], half, dst=out.v, interpolation=interpolation)
        return out
    scale = win_w / out_w
    theta = math.radians(-view.angle)
    c, s = math.cos(theta) * scale, math.sin(theta) * scale
    linear = np.array([[c, -s], [s, c]], dtype=np.float64)
    shift = np.array(
        [view.cx - (c * out_w / 2 - s * out_h / 2), view.cy - (s * out_w / 2 + c * out_h / 2)]
    )
    # A chroma sample sits at the centre of its 2x2 luma block: map through luma coordinates.
    shift_c = (linear @ np.array([0.5, 0.5]) + shift - 0.5) / 2
    for plane, target, offset in (
        (still.y, out.y, shift),
        (still.u, out.u, shift_c),
        (still.v, out.v, shift_c),
    ):
        matrix = np.hstack([linear, offset.reshape(2, 1)])
        cv2.warpAffine(
            plane,
            matrix,
            (target.shape[1], target.shape[0]),
            dst=target,
            flags=cv2.INTER_LINEAR | cv2.WARP_INVERSE_MAP,
            borderMode=cv2.BORDER_REFLECT_101,
        )
    return out


def mix(a: I420, b: I420, p: float, style: str) -> I420:
    """A transition from ``a`` to ``b`` at ``p`` (0 to 1); may reuse ``a``."""
    if style == "crossfade":
        cv2.addWeighted(a.buf, 1.0 - p, b.buf, p, 0.0, dst=a.buf)
        return a
    if style == "slide":
        shift = _even(ease(p) * a.width)
        out = I420(a.width, a.height)
        for pa, pb, target, cut in zip(
            a.planes, b.planes, out.planes, (shift, shift // 2, shift // 2), strict=True
        ):
            across = pa.shape[1]
            target[:, : across - cut] = pa[:, cut:]
            target[:, across - cut :] = pb[:, :cut]
        return out
    if style == "wipe":
        edge = _even(p * a.width)
        for pa, pb, cut in zip(a.planes, b.planes, (edge, edge // 2, edge // 2), strict=True):
            pa[:, :cut] = pb[:, :cut]
        return a
    return a if p < 0.5 else b


def fade(frame: I420, level: float) -> I420:
    """``frame`` darkened towards black by ``level`` (1 unchanged, 0 black), as a new frame."""
    out = I420(frame.width, frame.height)
    for source, target, rest in zip(
        frame.planes, out.planes, (BLACK_Y, NEUTRAL_C, NEUTRAL_C), strict=True
    ):
        target[:] = cv2.convertScaleAbs(source, alpha=level, beta=rest * (1.0 - level))
    return out


class FrameDecor:
    """The image-edit engine's border and caption layers, in I420, laid over each frame."""

    def __init__(self, decor: Decor) -> None:
        self.inner = decor.inner
        self.offset = decor.offset
        self.frame = I420.from_rgb(decor.frame) if decor.frame is not None else None
        self.box: tuple[int, int, int, int] | None = None
        self.caption: list[tuple[Array, Array]] = []
        if decor.caption_box is not None:
            assert decor.caption_rgb is not None and decor.caption_alpha is not None
            self.box = decor.caption_box
            colour = I420.from_rgb(np.clip(decor.caption_rgb, 0, 255).astype(np.uint8))
            alpha = np.ascontiguousarray(decor.caption_alpha[:, :, 0], dtype=np.float32)
            half = cv2.resize(
                alpha, (colour.width // 2, colour.height // 2), interpolation=cv2.INTER_AREA
            )
            self.caption = [
                (colour.y.astype(np.float32), alpha),
                (colour.u.astype(np.float32), half),
                (colour.v.astype(np.float32), half),
            ]

    def apply(self, picture: I420) -> I420:
        """``picture`` (inner size) with the caption and inside the border."""
        if self.box is not None:
            x0, y0, x1, y1 = self.box
            for plane, (colour, alpha), k in zip(
                picture.planes, self.caption, (1, 2, 2), strict=True
            ):
                region = plane[y0 // k : y1 // k, x0 // k : x1 // k]
                mixed = region.astype(np.float32)
                mixed += (colour - mixed) * alpha
                region[:] = mixed.astype(np.uint8)
        if self.frame is None:
            return picture
        ox, oy = self.offset
        for plane, target, k in zip(picture.planes, self.frame.planes, (1, 2, 2), strict=True):
            h, w = plane.shape
            target[oy // k : oy // k + h, ox // k : ox // k + w] = plane
        return self.frame
