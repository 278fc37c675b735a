"""Neural style transfer and honest prompt reading through the real app and worker, on
SQLite and PostgreSQL: named looks and another input's look for ``genhook/image-edit`` and
``genhook/image-to-video`` at the exact requested size, unquoted captions, and every part
of a prompt that became no operation listed under ``info.ignored``."""

from __future__ import annotations

import base64
import io
from typing import Any
from urllib.parse import urlsplit

import numpy as np
import pytest
from PIL import Image, ImageDraw

from genhook.client import ModelInfo
from genhook.engines.style_names import STYLE_NAMES
from genhook.errors import ErrorCode
from tests.conftest import Harness

EDIT = "genhook/image-edit"
VIDEO = "genhook/image-to-video"


def scene(size: tuple[int, int] = (256, 192)) -> Image.Image:
    """A sky, a sun, hills and a house: edges and flat areas for a style to work on."""
    width, height = size
    rows = np.linspace(0, 1, height, dtype=np.float32)[:, None, None]
    sky = (np.array([120, 170, 240]) * (1 - rows) + np.array([200, 220, 250]) * rows).repeat(
        width, axis=1
    )
    image = Image.fromarray(sky.astype(np.uint8))
    draw = ImageDraw.Draw(image)
    draw.ellipse((width * 0.7, 10, width * 0.9, 10 + width * 0.2), fill=(255, 220, 60))
    draw.polygon(
        [
            (0, height * 0.8),
            (width * 0.3, height * 0.55),
            (width, height * 0.6),
            (width, height),
            (0, height),
        ],
        fill=(60, 150, 60),
    )
    draw.rectangle((width * 0.25, height * 0.55, width * 0.5, height * 0.85), fill=(200, 80, 60))
    return image


def stripes(size: int = 200) -> Image.Image:
    """A style picture unlike the scene: bold diagonal stripes of blue and orange."""
    y, x = np.mgrid[0:size, 0:size]
    band = ((x + y) // 20) % 2 == 0
    pixels = np.where(band[..., None], [20, 40, 200], [250, 140, 20]).astype(np.uint8)
    return Image.fromarray(pixels)


def data_url(image: Image.Image) -> str:
    buffer = io.BytesIO()
    image.save(buffer, "PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


async def edited(h: Harness, prompt: str, images: list[Image.Image], **extra: Any) -> Any:
    body = {
        "model": EDIT,
        "prompt": prompt,
        "images": [data_url(i) for i in images],
        "size": "1024*1024",
        "output_format": "png",
        "thinking": "disabled",
        **extra,
    }
    response = await h.submit(body)
    assert response.status_code == 200, response.text
    assert await h.run_all() == 1
    result = await h.result(response.json()["id"])
    assert result["status"] == "completed", result
    return result


async def picture(h: Harness, url: str) -> Image.Image:
    response = await h.client.get(urlsplit(url).path)
    assert response.status_code == 200
    return Image.open(io.BytesIO(response.content)).convert("RGB")


def difference(a: Image.Image, b: Image.Image) -> float:
    """Mean absolute difference of two pictures on a 0 to 255 scale, at a's size."""
    return float(
        np.abs(np.asarray(a, np.float32) - np.asarray(b.resize(a.size), np.float32)).mean()
    )


async def test_named_styles_restyle_at_the_exact_size(harness: Harness) -> None:
    photo = scene()
    mosaic = await edited(harness, "in the style of a mosaic", [photo])
    assert mosaic["info"]["plan"] == [
        {"op": "style_transfer", "style": "mosaic", "from": "in the style of a mosaic"}
    ]
    assert "ignored" not in mosaic["info"]
    swirl = await edited(harness, "swirl style, then add a thin white border", [photo])
    assert [step["op"] for step in swirl["info"]["plan"]] == ["style_transfer", "border"]
    assert swirl["info"]["plan"][0]["style"] == "swirl"
    first = await picture(harness, mosaic["outputs"][0])
    second = await picture(harness, swirl["outputs"][0])
    assert first.size == second.size == (1024, 1024)
    plain = await picture(harness, (await edited(harness, "resize it", [photo]))["outputs"][0])
    # Each look changes the picture, and the two looks differ from each other.
    assert difference(first, plain) > 20 and difference(second, plain) > 20
    assert difference(first, second) > 20
    assert mosaic["outputs"][0] != swirl["outputs"][0]


async def test_the_second_image_lends_its_style_and_is_not_shown(harness: Harness) -> None:
    photo = scene((320, 240))
    result = await edited(
        harness, "in the style of the second image", [photo, stripes()], size="1536*1536"
    )
    info = result["info"]
    assert info["plan"][0]["op"] == "style_transfer"
    assert (info["plan"][0]["style"], info["plan"][0]["style_image"]) == ("image 2", 2)
    assert len(info["inputs"]) == 2 and "notes" not in info  # no default side-by-side
    output = await picture(harness, result["outputs"][0])
    assert output.size == (1536, 1536)
    # The stripes' blue and orange reach the scene; the sky's even gradient is gone.
    plain = scene((320, 240)).resize((1536, 1536))
    assert difference(output, plain) > 20
    assert np.asarray(output, np.float32)[:400].std() > np.asarray(plain, np.float32)[:400].std()


async def test_a_style_image_alone_is_refused(harness: Harness) -> None:
    body = {
        "model": EDIT,
        "prompt": "in the style of the first image",
        "images": [data_url(scene())],
        "size": "1024*1024",
    }
    response = await harness.submit(body)
    assert await harness.run_all() == 1
    result = await harness.result(response.json()["id"])
    assert result["status"] == "failed", result
    assert result["error_code"] == int(ErrorCode.INSTRUCTION_INVALID)
    assert "style image" in result["error"], result


async def test_unquoted_captions_and_ignored_parts(harness: Harness) -> None:
    result = await edited(
        harness,
        "make it warmer and increase contrast, add the text Hello World at the bottom, "
        "sharpen it with dragons",
        [scene()],
    )
    info = result["info"]
    plan = {step["op"]: step for step in info["plan"]}
    assert set(plan) == {"contrast", "caption", "sharpen"}
    assert (plan["caption"]["text"], plan["caption"]["position"]) == (
        "Hello World",
        "bottom-center",
    )
    assert info["ignored"] == ["make it warmer", "dragons"]
    words = await edited(harness, "put the words Big Sale on top", [scene()])
    caption = words["info"]["plan"][0]
    assert (caption["op"], caption["text"], caption["position"]) == (
        "caption",
        "Big Sale",
        "top-center",
    )


async def video(h: Harness, prompt: str, images: list[Image.Image]) -> Any:
    body = {
        "model": VIDEO,
        "prompt": prompt,
        "images": [data_url(i) for i in images],
        "duration": 1,
        "resolution": "480p",
        "fps": 24,
    }
    response = await h.submit(body, path="generateVideo")
    assert response.status_code == 200, response.text
    assert await h.run_all() == 1
    result = await h.result(response.json()["id"])
    assert result["status"] == "completed", result
    return result


async def test_the_video_model_takes_the_same_looks(harness: Harness) -> None:
    named = await video(harness, "zoom in, in the style of a woodcut", [scene((320, 240))])
    looks = [step for step in named["info"]["plan"] if step.get("op") == "style_transfer"]
    assert [look["style"] for look in looks] == ["woodcut"]
    lent = await video(
        harness, "zoom in, in the style of the second image", [scene((320, 240)), stripes()]
    )
    looks = [step for step in lent["info"]["plan"] if step.get("op") == "style_transfer"]
    assert [(look["style"], look["style_image"]) for look in looks] == [("image 2", 2)]
    # The style image lends its look and is not played: one still, so no crossfade.
    assert not any("crossfade" in note for note in lent["info"].get("notes", []))


@pytest.mark.parametrize("model", [EDIT, VIDEO])
async def test_the_catalogue_lists_the_styles(harness: Harness, model: str) -> None:
    response = await harness.client.get(f"/api/v1/models/{model}", headers=harness.headers)
    assert response.status_code == 200, response.text
    choices = response.json()["choices"]
    assert choices["styles"] == list(STYLE_NAMES) and "mosaic" in choices["styles"]
    assert "second image" in choices["style_from_image"]
    assert ModelInfo.from_json(response.json()).choices == choices  # as the SDK reads it
