"""Single-picture operations: one function per vocabulary entry, Pillow and OpenCV only.

Every function takes and returns an RGB or RGBA ``Image``; an alpha channel is carried
through untouched unless the operation is about it (background removal). Sizes the user
gives in pixels are output pixels and are scaled to the working picture by ``Context.px``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import cv2
import numpy as np
import numpy.typing as npt
from PIL import Image, ImageDraw, ImageEnhance, ImageFilter, ImageOps

from genhook.engines.image_edit._plan import Step
from genhook.engines.image_edit._segment import foreground_mask
from genhook.engines.image_edit._style import Stylizer
from genhook.engines.media.nsfw import Box, Detector
from genhook.errors import ErrorCode, TaskFailure

Array = npt.NDArray[Any]
_SEPIA = np.array(
    [[0.393, 0.769, 0.189], [0.349, 0.686, 0.168], [0.272, 0.534, 0.131]], dtype=np.float32
)


@dataclass(slots=True)
class Context:
    out_size: tuple[int, int]
    fast: bool
    detector: Detector
    stylizer: Stylizer | None = None
    # 0-based input index -> the picture of an input that only lends its style.
    style_images: dict[int, Image.Image] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    faces_found: int = 0

    def px(self, image: Image.Image, output_px: float) -> float:
        """``output_px`` output pixels expressed in pixels of ``image``."""
        return output_px * max(image.size) / max(self.out_size)

    @property
    def face_resolution(self) -> int:
        return 320 if self.fast else 640


def split_alpha(image: Image.Image) -> tuple[Image.Image, Image.Image | None]:
    if image.mode == "RGBA":
        return image.convert("RGB"), image.getchannel("A")
    return image, None


def join_alpha(rgb: Image.Image, alpha: Image.Image | None) -> Image.Image:
    if alpha is None:
        return rgb
    if alpha.size != rgb.size:
        alpha = alpha.resize(rgb.size, Image.Resampling.BILINEAR)
    out = rgb.convert("RGBA")
    out.putalpha(alpha)
    return out


def _rgb_op(fn: Callable[[Image.Image], Image.Image]) -> Callable[[Image.Image], Image.Image]:
    def wrapped(image: Image.Image) -> Image.Image:
        rgb, alpha = split_alpha(image)
        return join_alpha(fn(rgb), alpha)

    return wrapped


def _array_op(fn: Callable[[Array], Array]) -> Callable[[Image.Image], Image.Image]:
    return _rgb_op(lambda rgb: Image.fromarray(fn(np.asarray(rgb))))


def grayscale(image: Image.Image) -> Image.Image:
    return _rgb_op(lambda rgb: ImageOps.grayscale(rgb).convert("RGB"))(image)


def sepia(image: Image.Image) -> Image.Image:
    def fn(a: Array) -> Array:
        out: Array = a.astype(np.float32) @ _SEPIA.T
        return np.clip(out, 0, 255).astype(np.uint8)

    return _array_op(fn)(image)


def invert(image: Image.Image) -> Image.Image:
    return _rgb_op(ImageOps.invert)(image)


_ENHANCERS: dict[str, Callable[[Image.Image], ImageEnhance._Enhance]] = {
    "brightness": ImageEnhance.Brightness,
    "contrast": ImageEnhance.Contrast,
    "saturation": ImageEnhance.Color,
    "sharpness": ImageEnhance.Sharpness,
}


def enhance(image: Image.Image, prop: str, factor: float) -> Image.Image:
    enhancer = _ENHANCERS[prop]
    return _rgb_op(lambda rgb: enhancer(rgb).enhance(factor))(image)


def _sigma(image: Image.Image, ctx: Context, params: dict[str, Any], base: float) -> float:
    if "radius_px" in params:
        return max(0.5, ctx.px(image, float(params["radius_px"])))
    factor = {"light": 0.5, "strong": 2.5}.get(str(params.get("strength")), 1.0)
    return max(0.5, max(image.size) * base * factor)


def gaussian_array(a: Array, sigma: float) -> Array:
    """Gaussian blur; a wide one runs on a reduced copy, since its cost grows with the kernel
    and a blurred picture has no detail a reduction could lose."""
    if sigma <= 6.0:
        return np.asarray(cv2.GaussianBlur(a, (0, 0), sigma))
    factor = sigma / 3.0
    height, width = a.shape[:2]
    small = cv2.resize(
        a,
        (max(1, round(width / factor)), max(1, round(height / factor))),
        interpolation=cv2.INTER_AREA,
    )
    small = cv2.GaussianBlur(small, (0, 0), 3.0)
    return np.asarray(cv2.resize(small, (width, height), interpolation=cv2.INTER_LINEAR))


def gaussian(image: Image.Image, sigma: float) -> Image.Image:
    def fn(a: Array) -> Array:
        return gaussian_array(a, sigma)

    if image.mode == "RGBA":
        return Image.fromarray(fn(np.asarray(image)))
    return Image.fromarray(fn(np.asarray(image)))


def blur(image: Image.Image, ctx: Context, params: dict[str, Any]) -> Image.Image:
    return gaussian(image, _sigma(image, ctx, params, 0.004))


def sharpen(image: Image.Image, ctx: Context, params: dict[str, Any]) -> Image.Image:
    """Unsharp mask: add back ``amount`` times the detail a small blur removes."""
    sigma = max(1.0, max(image.size) / 600)
    amount = float(params.get("amount_percent", 120)) / 100.0

    def fn(a: Array) -> Array:
        blurred = cv2.GaussianBlur(a, (0, 0), sigma)
        return np.asarray(cv2.addWeighted(a, 1.0 + amount, blurred, -amount, 0))

    return _array_op(fn)(image)


def rotate(image: Image.Image, ctx: Context, degrees_clockwise: float) -> Image.Image:
    turns = {90.0: Image.Transpose.ROTATE_270, -90.0: Image.Transpose.ROTATE_90}
    if degrees_clockwise in turns:
        return image.transpose(turns[degrees_clockwise])
    if degrees_clockwise in (180.0, -180.0):
        return image.transpose(Image.Transpose.ROTATE_180)
    # Any other angle: the canvas grows to hold the whole turned picture (OpenCV's affine
    # warp, several times faster than Pillow's rotate), corners filled black or transparent.
    width, height = image.size
    radians = math.radians(degrees_clockwise)
    cos, sin = abs(math.cos(radians)), abs(math.sin(radians))
    new_w = max(1, math.ceil(width * cos + height * sin - 1e-6))
    new_h = max(1, math.ceil(width * sin + height * cos - 1e-6))
    matrix = cv2.getRotationMatrix2D((width / 2, height / 2), -degrees_clockwise, 1.0)
    matrix[0, 2] += (new_w - width) / 2
    matrix[1, 2] += (new_h - height) / 2
    fill = (0, 0, 0, 0) if image.mode == "RGBA" else (0, 0, 0)
    turned = cv2.warpAffine(
        np.asarray(image),
        matrix,
        (new_w, new_h),
        flags=cv2.INTER_LINEAR if ctx.fast else cv2.INTER_CUBIC,
        borderMode=cv2.BORDER_CONSTANT,
        borderValue=fill,
    )
    return Image.fromarray(turned)


def flip(image: Image.Image, axis: str) -> Image.Image:
    if axis == "vertical":
        return image.transpose(Image.Transpose.FLIP_TOP_BOTTOM)
    return image.transpose(Image.Transpose.FLIP_LEFT_RIGHT)


def crop_box(
    size: tuple[int, int], aspect: tuple[float, float], anchor: str = "center"
) -> tuple[int, int, int, int]:
    width, height = size
    target = aspect[0] / aspect[1]
    if width / height > target:
        new_w, new_h = max(1, round(height * target)), height
    else:
        new_w, new_h = width, max(1, round(width / target))
    left = (width - new_w) // 2
    top = (height - new_h) // 2
    if anchor == "left":
        left = 0
    elif anchor == "right":
        left = width - new_w
    elif anchor == "top":
        top = 0
    elif anchor == "bottom":
        top = height - new_h
    return left, top, left + new_w, top + new_h


def crop(image: Image.Image, aspect: str, anchor: str) -> Image.Image:
    a, b = (float(x) for x in aspect.split(":"))
    return image.crop(crop_box(image.size, (a, b), anchor))


def pixelate_region(image: Image.Image, block: int) -> Image.Image:
    block = max(2, int(block))
    width, height = image.size
    small = image.resize(
        (max(1, math.ceil(width / block)), max(1, math.ceil(height / block))),
        Image.Resampling.BOX,
    )
    big = small.resize((small.width * block, small.height * block), Image.Resampling.NEAREST)
    return big.crop((0, 0, width, height))


def pixelate(image: Image.Image, ctx: Context, params: dict[str, Any]) -> Image.Image:
    if "block_px" in params:
        block = ctx.px(image, float(params["block_px"]))
    else:
        cells = {"light": 96, "strong": 32}.get(str(params.get("strength")), 64)
        block = max(image.size) / cells
    return pixelate_region(image, round(block))


def posterize(image: Image.Image, levels: int) -> Image.Image:
    step = 255.0 / (levels - 1)
    table = np.array(
        [round(min(levels - 1, math.floor(v * levels / 256)) * step) for v in range(256)],
        dtype=np.uint8,
    )
    return _array_op(lambda a: table[a])(image)


def _auto_canny(gray: Array) -> Array:
    """Canny with thresholds from Otsu's split of the picture, so dark and bright pictures
    both keep their real edges and drop sensor noise."""
    otsu, _ = cv2.threshold(gray, 0, 255, cv2.THRESH_BINARY + cv2.THRESH_OTSU)
    high = max(40.0, float(otsu))
    return np.asarray(cv2.Canny(gray, 0.5 * high, high))


def edges(image: Image.Image, ctx: Context, style: str) -> Image.Image:
    def fn(a: Array) -> Array:
        gray = cv2.cvtColor(a, cv2.COLOR_RGB2GRAY)
        sigma = max(1.0, max(gray.shape) / 1024)
        found = _auto_canny(cv2.GaussianBlur(gray, (0, 0), sigma))
        thickness = max(1, round(max(gray.shape) / 1024))
        if thickness > 1:
            found = cv2.dilate(found, np.ones((thickness, thickness), np.uint8))
        lines = 255 - found if style == "dark_lines" else found
        return np.repeat(lines[:, :, None], 3, axis=2)

    return _array_op(fn)(image)


def sketch(image: Image.Image, colored: bool) -> Image.Image:
    def fn(a: Array) -> Array:
        gray = cv2.cvtColor(a, cv2.COLOR_RGB2GRAY).astype(np.float32)
        sigma = max(2.0, max(gray.shape) / 100)
        blurred = cv2.GaussianBlur(255.0 - gray, (0, 0), sigma)
        dodge = np.clip(gray * 255.0 / np.maximum(255.0 - blurred, 1.0), 0, 255)
        if not colored:
            out = dodge.astype(np.uint8)
            return np.repeat(out[:, :, None], 3, axis=2)
        tint = cv2.addWeighted(
            a.astype(np.float32), 0.55, np.full_like(a, 255, np.float32), 0.45, 0
        )
        toned: Array = np.clip(tint * (dodge[:, :, None] / 255.0), 0, 255)
        return toned.astype(np.uint8)

    return _array_op(fn)(image)


def _shrink(a: Array, longest: int) -> Array:
    """A copy whose long side is at most ``longest``: stylization cost grows with area."""
    height, width = a.shape[:2]
    scale = min(1.0, longest / max(height, width))
    size = (max(1, round(width * scale)), max(1, round(height * scale)))
    return np.asarray(cv2.resize(a, size, interpolation=cv2.INTER_AREA))


def cartoon(image: Image.Image, ctx: Context) -> Image.Image:
    def fn(a: Array) -> Array:
        height, width = a.shape[:2]
        small = _shrink(a, 384 if ctx.fast else 512)
        for _ in range(2):
            small = cv2.bilateralFilter(small, 7, 60, 7)
        color = cv2.resize(small, (width, height), interpolation=cv2.INTER_LINEAR)
        color = (color // 32) * 32 + 16
        gray = cv2.medianBlur(cv2.cvtColor(a, cv2.COLOR_RGB2GRAY), 5)
        block = max(3, (max(height, width) // 150) | 1)
        ink = cv2.adaptiveThreshold(
            gray, 255, cv2.ADAPTIVE_THRESH_MEAN_C, cv2.THRESH_BINARY, block, 5
        )
        return np.asarray(cv2.bitwise_and(color, color, mask=ink))

    return _array_op(fn)(image)


def painting(image: Image.Image, ctx: Context) -> Image.Image:
    def fn(a: Array) -> Array:
        height, width = a.shape[:2]
        small = _shrink(a, 288 if ctx.fast else 384)
        styled = cv2.stylization(small, sigma_s=60, sigma_r=0.45)
        interpolation = cv2.INTER_LINEAR if ctx.fast else cv2.INTER_CUBIC
        return np.asarray(cv2.resize(styled, (width, height), interpolation=interpolation))

    return _array_op(fn)(image)


def vignette(image: Image.Image, strength_percent: float) -> Image.Image:
    strength = max(0.0, min(strength_percent, 100.0)) / 100.0

    def fn(a: Array) -> Array:
        height, width = a.shape[:2]
        ys = np.linspace(-1.0, 1.0, height, dtype=np.float32)[:, None]
        xs = np.linspace(-1.0, 1.0, width, dtype=np.float32)[None, :]
        radius = np.sqrt(xs * xs + ys * ys) / math.sqrt(2.0)
        mask = 1.0 - strength * np.clip((radius - 0.35) / 0.65, 0.0, 1.0) ** 1.5
        return np.clip(a.astype(np.float32) * mask[:, :, None], 0, 255).astype(np.uint8)

    return _array_op(fn)(image)


def detect_faces(image: Image.Image, ctx: Context) -> list[Box]:
    return ctx.detector.detect(image, ctx.face_resolution).faces


def faces(image: Image.Image, ctx: Context, op: str, strength: str, clause: str) -> Image.Image:
    found = detect_faces(image, ctx)
    if not found:
        raise TaskFailure(
            ErrorCode.INSTRUCTION_INVALID,
            f"cannot apply {clause!r}: no face was detected, so there is nothing to "
            f"{'blur' if op == 'blur_faces' else 'pixelate'}",
        )
    ctx.faces_found += len(found)
    rgb, alpha = split_alpha(image)
    out = rgb.copy()
    width, height = rgb.size
    for box in found:
        grow = 0.2
        x0 = max(0, int(box.x - box.w * grow))
        y0 = max(0, int(box.y - box.h * grow))
        x1 = min(width, int(box.x + box.w * (1 + grow)))
        y1 = min(height, int(box.y + box.h * (1 + grow)))
        region = out.crop((x0, y0, x1, y1))
        if op == "pixelate_faces":
            cells = {"light": 12, "strong": 5}.get(strength, 8)
            hidden = pixelate_region(region, max(2, round(max(region.size) / cells)))
            out.paste(hidden, (x0, y0))
        else:
            sigma = max(region.size) / {"light": 12.0, "strong": 4.0}.get(strength, 7.0)
            hidden = gaussian(region, sigma)
            mask = Image.new("L", region.size, 0)
            ImageDraw.Draw(mask).ellipse((0, 0, region.width - 1, region.height - 1), fill=255)
            mask = mask.filter(ImageFilter.GaussianBlur(max(1.0, max(region.size) / 30)))
            out.paste(hidden, (x0, y0), mask)
    return join_alpha(out, alpha)


def _subject_mask(image: Image.Image, ctx: Context, clause: str) -> Array:
    rgb, _ = split_alpha(image)
    array = np.asarray(rgb)
    face_boxes = ctx.detector.detect(rgb, 320).faces
    mask = foreground_mask(array, face_boxes, fast=ctx.fast)
    if float(mask.mean()) < 0.005:
        raise TaskFailure(
            ErrorCode.INSTRUCTION_INVALID,
            f"cannot apply {clause!r}: no foreground subject was found to keep",
        )
    return mask


def background(image: Image.Image, ctx: Context, step: Step) -> Image.Image:
    rgb, alpha = split_alpha(image)
    mask = _subject_mask(image, ctx, step.clause)
    if alpha is not None:
        mask = mask * (np.asarray(alpha, dtype=np.float32) / 255.0)
    if step.op == "remove_background":
        out = rgb.convert("RGBA")
        out.putalpha(Image.fromarray(np.clip(mask * 255.0, 0, 255).astype(np.uint8)))
        return out
    array = np.asarray(rgb).astype(np.float32)
    behind: Array
    if step.op == "blur_background":
        factor = {"light": 0.006, "strong": 0.03}.get(str(step.params.get("strength")), 0.015)
        sigma = max(2.0, max(rgb.size) * factor)
        behind = gaussian_array(np.asarray(rgb), sigma).astype(np.float32)
    else:
        color = str(step.params["color"])
        r, g, b = (int(color[i : i + 2], 16) for i in (1, 3, 5))
        behind = np.empty_like(array)
        behind[:] = (r, g, b)
    weight = mask[:, :, None]
    mixed = np.clip(array * weight + behind * (1.0 - weight), 0, 255).astype(np.uint8)
    return join_alpha(Image.fromarray(mixed), alpha)


def style_transfer(image: Image.Image, ctx: Context, params: dict[str, Any]) -> Image.Image:
    """A named look, or the look of another input; alpha is kept as it was."""
    stylizer = ctx.stylizer
    if stylizer is None:  # pragma: no cover - every engine hands its stylizer over
        raise TaskFailure(ErrorCode.ENGINE_ERROR, "style transfer is not available here")
    if "style_image" in params:
        source = ctx.style_images[int(params["style_image"]) - 1].convert("RGB")
        return _rgb_op(lambda rgb: stylizer.from_image(rgb, source))(image)
    return _rgb_op(lambda rgb: stylizer.named(rgb, str(params["style"])))(image)


def apply(step: Step, image: Image.Image, ctx: Context) -> Image.Image:
    """Apply one non-combining, non-finishing step to ``image``."""
    p = step.params
    op = step.op
    if op == "grayscale":
        return grayscale(image)
    if op == "sepia":
        return sepia(image)
    if op == "invert":
        return invert(image)
    if op in _ENHANCERS:
        return enhance(image, op, float(p["factor"]))
    if op == "blur":
        return blur(image, ctx, p)
    if op == "sharpen":
        return sharpen(image, ctx, p)
    if op == "rotate":
        return rotate(image, ctx, float(p["degrees_clockwise"]))
    if op == "flip":
        return flip(image, str(p["axis"]))
    if op == "crop":
        return crop(image, str(p["aspect"]), str(p["anchor"]))
    if op == "pixelate":
        return pixelate(image, ctx, p)
    if op == "posterize":
        return posterize(image, int(p["levels"]))
    if op == "edges":
        return edges(image, ctx, str(p["style"]))
    if op == "sketch":
        return sketch(image, bool(p.get("colored")))
    if op == "cartoon":
        return cartoon(image, ctx)
    if op == "painting":
        return painting(image, ctx)
    if op == "vignette":
        return vignette(image, float(p["strength_percent"]))
    if op in ("blur_faces", "pixelate_faces"):
        return faces(image, ctx, op, str(p.get("strength", "normal")), step.clause)
    if op in ("remove_background", "blur_background", "color_background"):
        return background(image, ctx, step)
    if op == "resize":
        return image
    if op == "style_transfer":
        return style_transfer(image, ctx, p)
    raise TaskFailure(ErrorCode.ENGINE_ERROR, f"operation {op!r} has no implementation")
