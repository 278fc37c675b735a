"""False-positive rate of the NSFW detector on ordinary pictures, at candidate thresholds.

The pictures: the test suite's own fixtures (flat colours, quadrants, gradients, noise, a
disc on texture, the portrait and the other photos matplotlib ships), and generated scenes
(random shapes, gradients, text, crops of the photos), each also in the variants the engine
produces (grayscale, inverted, posterized, edges, blurred, cover-fit to another aspect). None
shows nudity, so every score at or over a threshold is a false positive.

    .venv/bin/python benchmarks/nsfw_threshold.py                 # 200 scenes per kind
    .venv/bin/python benchmarks/nsfw_threshold.py --scenes 50 --json out.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw, ImageFilter, ImageFont, ImageOps

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.unit.image_edit_fixtures import (
    gradient,
    noise,
    portrait_path,
    quadrants,
    solid,
    subject_on_background,
)

from genhook.engines.media.nsfw import Detector

THRESHOLDS = (0.3, 0.4, 0.5, 0.55, 0.6, 0.65, 0.7, 0.75, 0.8, 0.85, 0.9)
WORDS = [
    "invoice",
    "meeting",
    "notes",
    "garden",
    "river",
    "harbour",
    "lunch",
    "menu",
    "total",
    "report",
    "draft",
]


def photos() -> list[Image.Image]:
    sample = portrait_path().parent
    names = ["grace_hopper.jpg", "Minduka_Present_Blue_Pack.png", "logo2.png"]
    return [Image.open(sample / name).convert("RGB") for name in names]


def fixtures() -> Iterator[tuple[str, Image.Image]]:
    yield "quadrants", quadrants()
    yield "gradient", gradient()
    for seed in range(5):
        yield f"noise {seed}", noise(seed=seed)
    for colour in [(0, 0, 0), (255, 255, 255), (220, 20, 20), (240, 200, 170), (200, 30, 30)]:
        yield f"solid {colour}", solid(colour)
    yield "subject", subject_on_background()
    for index, photo in enumerate(photos()):
        yield f"photo {index}", photo


def colour(rng: np.random.Generator) -> tuple[int, int, int]:
    r, g, b = (int(v) for v in rng.integers(0, 256, 3))
    return r, g, b


def shapes(rng: np.random.Generator) -> Image.Image:
    size = (int(rng.integers(256, 1025)), int(rng.integers(256, 1025)))
    image = Image.new("RGB", size, colour(rng))
    draw = ImageDraw.Draw(image)
    for _ in range(int(rng.integers(1, 12))):
        x0, x1 = sorted(int(v) for v in rng.integers(0, size[0], 2))
        y0, y1 = sorted(int(v) for v in rng.integers(0, size[1], 2))
        kind = int(rng.integers(0, 3))
        if kind == 0:
            draw.rectangle((x0, y0, x1, y1), fill=colour(rng))
        elif kind == 1:
            draw.ellipse((x0, y0, x1, y1), fill=colour(rng))
        else:
            xs, ys = rng.integers(0, size[0], 4), rng.integers(0, size[1], 4)
            points = [(int(x), int(y)) for x, y in zip(xs, ys, strict=True)]
            draw.polygon(points, fill=colour(rng))
    return image


def gradients(rng: np.random.Generator) -> Image.Image:
    height, width = int(rng.integers(256, 1025)), int(rng.integers(256, 1025))
    ys, xs = np.mgrid[0:height, 0:width].astype(np.float32)
    angle = float(rng.uniform(0, np.pi))
    t = (xs * np.cos(angle) + ys * np.sin(angle)) / (width + height)
    t = (t - t.min()) / max(1e-6, float(t.max() - t.min()))
    start, end = np.array(colour(rng)), np.array(colour(rng))
    pixels = start + (end - start) * t[..., None]
    return Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8))


def text(rng: np.random.Generator) -> Image.Image:
    image = Image.new("RGB", (int(rng.integers(320, 1025)), int(rng.integers(240, 769))))
    image.paste(colour(rng), (0, 0, *image.size))
    draw = ImageDraw.Draw(image)
    for row in range(int(rng.integers(2, 10))):
        font = ImageFont.load_default(size=int(rng.integers(12, 64)))
        words = " ".join(str(w) for w in rng.choice(WORDS, int(rng.integers(2, 6))))
        draw.text((10, 10 + row * 70), words, fill=colour(rng), font=font)
    return image


def crops(rng: np.random.Generator, sources: list[Image.Image]) -> Image.Image:
    photo = sources[int(rng.integers(0, len(sources)))]
    w, h = photo.size
    cw, ch = int(rng.integers(w // 4, w + 1)), int(rng.integers(h // 4, h + 1))
    x, y = int(rng.integers(0, w - cw + 1)), int(rng.integers(0, h - ch + 1))
    return photo.crop((x, y, x + cw, y + ch))


def variants(image: Image.Image) -> Iterator[tuple[str, Image.Image]]:
    yield "as is", image
    yield "grayscale", ImageOps.grayscale(image).convert("RGB")
    yield "inverted", ImageOps.invert(image)
    yield "posterized", ImageOps.posterize(image, 3)
    yield "edges", image.filter(ImageFilter.FIND_EDGES)
    yield "blurred", image.filter(ImageFilter.GaussianBlur(6))
    yield "cover 2048x1152", ImageOps.fit(image, (2048, 1152))


def pictures(scenes: int) -> Iterator[tuple[str, str, Image.Image]]:
    rng = np.random.default_rng(11)
    sources = photos()
    for name, image in fixtures():
        yield "fixtures", name, image
    for index in range(scenes):
        yield "shapes", f"shapes {index}", shapes(rng)
        yield "gradients", f"gradient {index}", gradients(rng)
        yield "text", f"text {index}", text(rng)
        yield "photo crops", f"crop {index}", crops(rng, sources)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenes", type=int, default=200, help="generated scenes per kind")
    parser.add_argument("--json", type=Path, help="also write the scores here")
    args = parser.parse_args()
    detector = Detector()
    scores: dict[str, list[float]] = {}
    worst: list[tuple[float, str]] = []
    started = time.perf_counter()
    for kind, name, image in pictures(args.scenes):
        for variant, picture in variants(image):
            score = detector.detect(picture).nsfw_score
            scores.setdefault(kind, []).append(score)
            worst.append((score, f"{name}, {variant}"))
    elapsed = time.perf_counter() - started
    every = [s for values in scores.values() for s in values]
    print(f"{len(every)} pictures scored in {elapsed:.1f} s")
    header = "threshold | " + " | ".join(scores) + " | all"
    print(header)
    for threshold in THRESHOLDS:
        cells = []
        for values in [*scores.values(), every]:
            hits = sum(s >= threshold for s in values)
            cells.append(f"{hits}/{len(values)} ({100 * hits / len(values):.2f} %)")
        print(f"{threshold:.2f} | " + " | ".join(cells))
    print("highest scores:")
    for score, name in sorted(worst, reverse=True)[:8]:
        print(f"  {score:.3f}  {name}")
    quantiles = np.quantile(np.array(every), [0.5, 0.9, 0.99, 0.999])
    print("median, p90, p99, p99.9: " + ", ".join(f"{q:.3f}" for q in quantiles))
    if args.json:
        args.json.write_text(json.dumps({"scores": scores}, indent=1))


if __name__ == "__main__":
    main()
