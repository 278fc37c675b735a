"""Pictures drawn in code for the image-edit engine tests, and a helper to run the engine."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from genhook.config import Settings
from genhook.engines.base import EngineJob, EngineResult
from genhook.engines.image_edit import ImageEditEngine

RED = (220, 20, 20)
GREEN = (20, 200, 40)
BLUE = (30, 40, 220)
YELLOW = (240, 220, 30)


def quadrants(size: tuple[int, int] = (256, 256)) -> Image.Image:
    """Top-left red, top-right green, bottom-left blue, bottom-right yellow."""
    width, height = size
    image = Image.new("RGB", size)
    image.paste(RED, (0, 0, width // 2, height // 2))
    image.paste(GREEN, (width // 2, 0, width, height // 2))
    image.paste(BLUE, (0, height // 2, width // 2, height))
    image.paste(YELLOW, (width // 2, height // 2, width, height))
    return image


def gradient(size: tuple[int, int] = (256, 256)) -> Image.Image:
    """Colorful and textured, so every operation has something to change."""
    width, height = size
    ys, xs = np.mgrid[0:height, 0:width]
    r = (xs * 255 / max(1, width - 1)).astype(np.uint8)
    g = (ys * 255 / max(1, height - 1)).astype(np.uint8)
    b = ((np.sin(xs / 7.0) * np.cos(ys / 5.0) + 1) * 127).astype(np.uint8)
    return Image.fromarray(np.dstack([r, g, b]))


def noise(size: tuple[int, int] = (256, 256), seed: int = 3) -> Image.Image:
    """Fine random texture: the most detail a blur or sharpen can act on."""
    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(40, 216, size=(size[1], size[0], 3), dtype=np.uint8))


def solid(color: tuple[int, int, int], size: tuple[int, int] = (128, 128)) -> Image.Image:
    return Image.new("RGB", size, color)


def subject_on_background(size: int = 320) -> Image.Image:
    """A textured blue-gray background with a big orange disc in the middle."""
    rng = np.random.default_rng(7)
    noise = rng.integers(-25, 26, size=(size, size, 3))
    base = np.array([90, 110, 150]) + noise
    ys, xs = np.mgrid[0:size, 0:size]
    disc = (xs - size / 2) ** 2 + (ys - size / 2) ** 2 <= (size * 0.28) ** 2
    base[disc] = np.array([240, 140, 20]) + rng.integers(-40, 41, size=(int(disc.sum()), 3))
    return Image.fromarray(np.clip(base, 0, 255).astype(np.uint8))


def encode(image: Image.Image, fmt: str = "PNG", **options: Any) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, fmt, **options)
    return buffer.getvalue()


def portrait_path() -> Path:
    """Grace Hopper's public-domain portrait, shipped inside matplotlib's wheel."""
    import matplotlib.cbook

    return Path(matplotlib.cbook.get_sample_data("grace_hopper.jpg", asfileobj=False))


def portrait_bytes() -> bytes:
    return portrait_path().read_bytes()


def run(
    engine: ImageEditEngine,
    prompt: str,
    images: list[bytes],
    **params: Any,
) -> tuple[Image.Image, EngineResult]:
    values: dict[str, Any] = {
        "model": "genhook/image-edit",
        "prompt": prompt,
        "size": "1024*1024",
        "output_format": "png",
        "thinking": "enabled",
        "prompt_optimization_mode": "standard",
        "enable_base64_output": False,
    }
    values.update(params)
    result = engine.run(EngineJob("task-test", "genhook/image-edit", values, images))
    assert len(result.outputs) == 1
    output = Image.open(io.BytesIO(result.outputs[0].data))
    output.load()
    return output, result


def make_engine(**settings: Any) -> ImageEditEngine:
    engine = ImageEditEngine(Settings(**settings))
    engine.load()
    return engine


def mean(image: Image.Image, box: tuple[int, int, int, int]) -> np.ndarray[Any, Any]:
    """Mean RGB of ``box`` (left, top, right, bottom)."""
    array = np.asarray(image.convert("RGB").crop(box), dtype=np.float64)
    return array.reshape(-1, 3).mean(axis=0)


def close(actual: np.ndarray[Any, Any], expected: tuple[int, int, int], tol: float = 30) -> bool:
    return bool(np.all(np.abs(actual - np.asarray(expected, dtype=np.float64)) <= tol))
