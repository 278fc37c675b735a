"""Foreground segmentation for background edits: OpenCV GrabCut, seeded sensibly.

No segmentation model ships in an installable wheel we can rely on offline, so GrabCut
runs on a reduced copy (its cost grows with pixels) seeded with what is known: a thin frame
along the edges is certainly background, the middle is probably the subject, and detected
faces (with the body below them) are certainly subject. The hard mask is cleaned, upsampled
and feathered so edges blend.
"""

from __future__ import annotations

from typing import Any

import cv2
import numpy as np
import numpy.typing as npt

from genhook.engines.media.nsfw import Box

Array = npt.NDArray[Any]


def foreground_mask(rgb: Array, faces: list[Box], *, fast: bool) -> Array:
    """Return a float32 mask in [0, 1] the size of ``rgb``; 1 is subject."""
    height, width = rgb.shape[:2]
    work = 160 if fast else 256
    iterations = 2 if fast else 3
    scale = min(1.0, work / max(height, width))
    sw, sh = max(8, round(width * scale)), max(8, round(height * scale))
    small = cv2.resize(rgb, (sw, sh), interpolation=cv2.INTER_AREA)
    bgr = cv2.cvtColor(small, cv2.COLOR_RGB2BGR)

    mask = np.full((sh, sw), cv2.GC_PR_BGD, np.uint8)
    inset_x, inset_y = max(1, round(sw * 0.06)), max(1, round(sh * 0.06))
    mask[inset_y : sh - inset_y, inset_x : sw - inset_x] = cv2.GC_PR_FGD
    edge_x, edge_y = max(1, round(sw * 0.02)), max(1, round(sh * 0.02))
    # Top and sides are background for certain; a subject often stands on the bottom edge,
    # so that edge is only probably background.
    mask[:edge_y, :] = cv2.GC_BGD
    mask[:, :edge_x] = cv2.GC_BGD
    mask[:, sw - edge_x :] = cv2.GC_BGD
    fx, fy = sw / width, sh / height
    for face in faces:
        x0, y0 = int(face.x * fx), int(face.y * fy)
        x1, y1 = int((face.x + face.w) * fx), int((face.y + face.h) * fy)
        fw, fh = x1 - x0, y1 - y0
        # Probable body: below the face, about three faces wide, down to the bottom edge.
        bx0, bx1 = max(edge_x, x0 - fw), min(sw - edge_x, x1 + fw)
        mask[y1:sh, bx0:bx1] = cv2.GC_PR_FGD
        # Certain subject: the middle of the face, and the neck and chest right below it.
        mx, my = fw // 5, fh // 5
        mask[y0 + my : y1 - my, x0 + mx : x1 - mx] = cv2.GC_FGD
        mask[y1 : min(sh, y1 + fh), x0 + mx : x1 - mx] = cv2.GC_FGD
    background_model = np.zeros((1, 65), np.float64)
    foreground_model = np.zeros((1, 65), np.float64)
    try:
        cv2.grabCut(  # type: ignore[call-overload]
            bgr, mask, None, background_model, foreground_model, iterations, cv2.GC_INIT_WITH_MASK
        )
    except cv2.error:
        # GrabCut refuses a picture it cannot model (e.g. a single flat color); nothing
        # can be told apart from the background there.
        return np.zeros((height, width), np.float32)
    hard = np.where((mask == cv2.GC_FGD) | (mask == cv2.GC_PR_FGD), 255, 0).astype(np.uint8)
    hard = _keep_large_parts(hard)
    kernel = np.ones((3, 3), np.uint8)
    closed = np.asarray(cv2.morphologyEx(hard, cv2.MORPH_CLOSE, kernel))
    soft = cv2.GaussianBlur(closed.astype(np.float32) / 255.0, (0, 0), 0.8)
    full = cv2.resize(soft, (width, height), interpolation=cv2.INTER_LINEAR)
    feather = max(0.8, max(height, width) / 800)
    full = cv2.GaussianBlur(full, (0, 0), feather)
    return np.clip(full, 0.0, 1.0).astype(np.float32)


def _keep_large_parts(hard: Array) -> Array:
    """Drop specks: keep connected parts at least 5% the size of the largest one."""
    count, labels, stats, _ = cv2.connectedComponentsWithStats(hard, connectivity=8)
    if count <= 2:
        return hard
    areas = stats[1:, cv2.CC_STAT_AREA]
    keep = np.flatnonzero(areas >= 0.05 * areas.max()) + 1
    return np.where(np.isin(labels, keep), 255, 0).astype(np.uint8)
