"""The output stage: fit to the exact requested size, border and caption, encode.

Border and caption are drawn here, at output resolution, so their lines and letters are
crisp and their sizes are in the output pixels the user asked in.
"""

from __future__ import annotations

import io
import textwrap
from typing import Any

import cv2
import numpy as np
from PIL import Image, ImageColor, ImageDraw, ImageFont

from genhook.engines.media import FitMode


def rgb(color: str) -> tuple[int, int, int]:
    r, g, b = ImageColor.getrgb(color)[:3]
    return r, g, b


def resize(image: Image.Image, size: tuple[int, int], fast: bool) -> Image.Image:
    """Resample with OpenCV, several times faster than Pillow at equal quality: bicubic
    up and pixel-area averaging down in standard mode, bilinear in fast mode."""
    size = (max(1, size[0]), max(1, size[1]))
    if image.size == size:
        return image
    if fast:
        interpolation = cv2.INTER_LINEAR
    elif size[0] * size[1] < image.width * image.height:
        interpolation = cv2.INTER_AREA
    else:
        interpolation = cv2.INTER_CUBIC
    array = cv2.resize(np.asarray(image), size, interpolation=interpolation)
    return Image.fromarray(array)


def fit(
    image: Image.Image,
    size: tuple[int, int],
    mode: FitMode,
    pad_color: str,
    fast: bool,
) -> Image.Image:
    """``cover`` scales to fill and crops the middle, ``contain`` scales to fit and pads,
    ``stretch`` ignores the aspect ratio."""
    width, height = size
    if image.size == size:
        return image
    if mode == "stretch":
        return resize(image, size, fast)
    if mode == "cover":
        target = width / height
        if image.width / image.height > target:
            crop_w, crop_h = max(1, round(image.height * target)), image.height
        else:
            crop_w, crop_h = image.width, max(1, round(image.width / target))
        left = (image.width - crop_w) // 2
        top = (image.height - crop_h) // 2
        return resize(image.crop((left, top, left + crop_w, top + crop_h)), size, fast)
    scale = min(width / image.width, height / image.height)
    inner = (max(1, round(image.width * scale)), max(1, round(image.height * scale)))
    scaled = resize(image, inner, fast)
    if image.mode == "RGBA":
        # Pasted without a mask, so the picture keeps its own transparency (a cut-out
        # subject stays cut out); only the padding is the opaque pad color.
        canvas = Image.new("RGBA", size, (*rgb(pad_color), 255))
        canvas.paste(scaled, ((width - inner[0]) // 2, (height - inner[1]) // 2))
        return canvas
    canvas = Image.new("RGB", size, rgb(pad_color))
    canvas.paste(scaled, ((width - inner[0]) // 2, (height - inner[1]) // 2))
    return canvas


def border_width(params: dict[str, Any], size: tuple[int, int], px_scale: float = 1.0) -> int:
    """Border width in pixels of a picture of ``size``; ``px_scale`` converts output px."""
    shorter = min(size)
    if "width_px" in params:
        width = float(params["width_px"]) * px_scale
    else:
        width = shorter * float(params.get("width_percent", 3.0)) / 100.0
    return max(1, min(round(width), shorter // 2 - 1))


def add_border(image: Image.Image, width: int, color: str) -> Image.Image:
    """Frame ``image`` inside its own size: the picture shrinks, nothing is cut off."""
    inner = (max(1, image.width - 2 * width), max(1, image.height - 2 * width))
    framed = Image.new(
        image.mode, image.size, (*rgb(color), 255) if image.mode == "RGBA" else rgb(color)
    )
    shrunk = resize(image, inner, fast=False)
    framed.paste(shrunk, (width, width))
    return framed


def surround(image: Image.Image, width: int, color: str) -> Image.Image:
    """Grow the canvas by ``width`` on every side (used on the final fitted content)."""
    size = (image.width + 2 * width, image.height + 2 * width)
    fill = (*rgb(color), 255) if image.mode == "RGBA" else rgb(color)
    framed = Image.new(image.mode, size, fill)
    framed.paste(image, (width, width))
    return framed


_CAPTION_SIZES = {"small": 0.05, "medium": 0.08, "large": 0.12}


def caption(image: Image.Image, params: dict[str, Any]) -> Image.Image:
    text = str(params["text"]).strip()
    if not text:
        return image
    width, height = image.size
    share = _CAPTION_SIZES.get(str(params.get("size")), 0.08)
    font_px = max(10, round(min(width, height) * share))
    margin = round(min(width, height) * 0.04)
    # Wrap to the picture's width (an average glyph is about 0.55 of the font size); shrink
    # the font until the text fits the height, and cut what still does not fit with "…".
    while True:
        chars = max(4, int((width - 2 * margin) / (font_px * 0.55)))
        lines = textwrap.wrap(text, chars) or [text]
        room = max(1, int((height - 2 * margin) / (font_px * 1.25)))
        if len(lines) <= room or font_px <= 12:
            break
        font_px = max(12, int(font_px * 0.8))
    if len(lines) > room:
        lines = [*lines[: room - 1], lines[room - 1][: max(1, chars - 1)] + "…"]
    font: Any = ImageFont.load_default(size=font_px)
    color = rgb(str(params.get("color", "#ffffff")))
    luminance = 0.299 * color[0] + 0.587 * color[1] + 0.114 * color[2]
    stroke = (0, 0, 0) if luminance > 110 else (255, 255, 255)
    stroke_width = max(1, font_px // 14)
    out = image.copy()
    draw = ImageDraw.Draw(out)
    block = "\n".join(lines)
    left, top, right, bottom = draw.multiline_textbbox(
        (0, 0), block, font=font, stroke_width=stroke_width, align="center"
    )
    text_w, text_h = right - left, bottom - top
    position = str(params.get("position", "bottom-center"))
    vertical, _, horizontal = position.partition("-")
    if position == "center":
        vertical = horizontal = "center"
    x = {"left": margin, "right": width - margin - text_w}.get(horizontal, (width - text_w) // 2)
    y = {"top": margin, "bottom": height - margin - text_h}.get(vertical, (height - text_h) // 2)
    x, y = max(0, x), max(0, y)
    align = horizontal if horizontal in ("left", "right") else "center"
    fill: tuple[int, ...] = (*color, 255) if out.mode == "RGBA" else color
    stroke_fill: tuple[int, ...] = (*stroke, 255) if out.mode == "RGBA" else stroke
    draw.multiline_text(
        (x - left, y - top),
        block,
        font=font,
        fill=fill,
        stroke_width=stroke_width,
        stroke_fill=stroke_fill,
        align=align,
    )
    return out


def flatten(image: Image.Image, background: tuple[int, int, int] = (255, 255, 255)) -> Image.Image:
    if image.mode != "RGBA":
        return image
    canvas = Image.new("RGB", image.size, background)
    canvas.paste(image, (0, 0), image)
    return canvas


def encode(image: Image.Image, output_format: str, fast: bool) -> tuple[bytes, str]:
    buffer = io.BytesIO()
    if output_format == "png":
        if image.mode == "RGBA" and image.getchannel("A").getextrema() == (255, 255):
            image = image.convert("RGB")
        image.save(buffer, "PNG", compress_level=1 if fast else 3)
        return buffer.getvalue(), "image/png"
    flat = flatten(image)
    if fast:
        flat.save(buffer, "JPEG", quality=85, subsampling="4:2:0")
    else:
        flat.save(buffer, "JPEG", quality=92, subsampling="4:4:4")
    return buffer.getvalue(), "image/jpeg"
