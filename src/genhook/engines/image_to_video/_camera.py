"""The virtual camera: where it looks in each still at each moment, and frame rendering.

Each still is prepared once at ``HEADROOM`` times the frame size, so zooming in up to that
factor never enlarges pixels. A frame is a window of the still, resized to the frame
(see ``_yuv.render``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy.typing as npt

from genhook.engines.image_to_video._motion import MotionPlan

Array = npt.NDArray[Any]

HEADROOM = 1.3
ZOOM_RANGE = (1.0, 1.3)  # window shrink factor at the start and end of a zoom in
DEFAULT_ZOOM = (1.0, 1.1)  # the gentle motion of a prompt that names none
PAN_ZOOM = 1.2  # a pan needs room to travel
SHAKE_ZOOM = 1.08
SHAKE_AMPLITUDE = 0.012  # of the frame width


def ease(t: float) -> float:
    """Smoothstep: moves start and end at rest instead of jerking."""
    t = min(1.0, max(0.0, t))
    return t * t * (3 - 2 * t)


@dataclass(frozen=True, slots=True)
class View:
    cx: float
    cy: float
    zoom: float  # >= 1: the window is the still's size divided by this
    angle: float  # degrees, clockwise


class Camera:
    """Views over a still of size ``still`` for one segment of the video."""

    def __init__(self, motion: MotionPlan, still: tuple[int, int], seconds: float) -> None:
        self.motion = motion
        self.width, self.height = still
        self.seconds = seconds
        self.floor = 1.0
        if motion.pan_x or motion.pan_y:
            self.floor = max(self.floor, PAN_ZOOM)
        if motion.shake:
            self.floor = max(self.floor, SHAKE_ZOOM)
        if motion.rotate_degrees:
            self.floor = max(self.floor, self._rotation_floor(abs(motion.rotate_degrees)))

    def _rotation_floor(self, degrees: float) -> float:
        """The least zoom at which the rotated window stays inside the still."""
        w, h = self.width, self.height
        worst = 1.0
        for step in range(65):
            theta = math.radians(min(degrees, 90.0) * step / 64)
            c, s = abs(math.cos(theta)), abs(math.sin(theta))
            worst = max(worst, (w * c + h * s) / w, (w * s + h * c) / h)
        return worst

    def view(self, t: float) -> View:
        """The view at progress ``t`` (0 to 1) of this segment."""
        motion = self.motion
        e = ease(t)
        if motion.zoom == "in":
            zoom = ZOOM_RANGE[0] + (ZOOM_RANGE[1] - ZOOM_RANGE[0]) * e
        elif motion.zoom == "out":
            zoom = ZOOM_RANGE[1] - (ZOOM_RANGE[1] - ZOOM_RANGE[0]) * e
        elif motion.default_motion:
            zoom = DEFAULT_ZOOM[0] + (DEFAULT_ZOOM[1] - DEFAULT_ZOOM[0]) * e
        else:
            zoom = 1.0
        if motion.zoom is not None and self.floor > 1.0:
            # Keep the zoom's travel, starting from the least zoom the other moves need.
            zoom = self.floor * zoom
        zoom = max(zoom, self.floor)
        room_x = (self.width - self.width / zoom) / 2
        room_y = (self.height - self.height / zoom) / 2
        cx = self.width / 2 + motion.pan_x * (2 * e - 1) * room_x
        cy = self.height / 2 + motion.pan_y * (2 * e - 1) * room_y
        if motion.shake:
            seconds = t * self.seconds
            amp = SHAKE_AMPLITUDE * self.width
            dx = math.sin(seconds * 23.0) + 0.5 * math.sin(seconds * 37.0 + 1.3)
            dy = math.sin(seconds * 29.0 + 0.7) + 0.5 * math.sin(seconds * 41.0 + 2.1)
            cx += min(room_x, amp) * dx / 1.5
            cy += min(room_y, amp) * dy / 1.5
        angle = motion.rotate_degrees * e
        return View(cx, cy, zoom, angle)
