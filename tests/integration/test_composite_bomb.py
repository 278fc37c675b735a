"""Pictures derived from several inputs are bounded before they are allocated.

A 1x1000 PNG and a 1000x1 PNG (268 bytes) declare 2,000 pixels; put side by side at the
first one's height they made a 1,000,000 x 1,000 picture (3 GB). Such strips are refused at
submit (400, naming the image) and by the worker's decoder (for an image fetched from a
URL); inputs within the shape limit are composed within a bound, for every kind of model
that composes: the image-edit engine (row, column, blend), the local edit models, and
image-to-video (each input fitted on its own).
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import pytest
from PIL import Image

from genhook.engines.image_edit._compose import blend, column, row
from genhook.engines.media.compose import side_by_side
from genhook.engines.media.decode import decode_image
from genhook.errors import ErrorCode, TaskFailure
from genhook.media import MAX_ASPECT_RATIO
from tests.conftest import Harness
from tests.support.images import data_url
from tests.support.tiny_pipelines import build
from tests.unit.image_edit_fixtures import make_engine, run

# The worst shapes still accepted: one side MAX_ASPECT_RATIO times the other, each way.
TALL = (128, 128 * MAX_ASPECT_RATIO)
WIDE = (128 * MAX_ASPECT_RATIO, 128)


def png(size: tuple[int, int]) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", size, (200, 30, 30)).save(buffer, "PNG")
    return buffer.getvalue()


def png_url(size: tuple[int, int]) -> str:
    import base64

    return "data:image/png;base64," + base64.b64encode(png(size)).decode()


async def test_submit_refuses_a_strip_and_names_it(harness: Harness) -> None:
    for images, field in (
        ([png_url((1, 1000)), png_url((1000, 1))], "images[0]"),
        ([data_url(), png_url((1000, 1))], "images[1]"),
    ):
        body = {"model": "test/fake-edit", "prompt": "x", "images": images}
        response = await harness.submit(body)
        assert response.status_code == 400, response.text
        error = response.json()["errors"][0]
        assert error["field"] == field
        assert "more than 32 times" in error["message"] and field in error["message"]
    # The worst shapes accepted are accepted.
    body = {"model": "test/fake-edit", "prompt": "x", "images": [png_url(TALL), png_url(WIDE)]}
    assert (await harness.submit(body)).status_code == 200


def test_the_worker_refuses_a_strip_fetched_from_a_url() -> None:
    with pytest.raises(TaskFailure) as caught:
        decode_image(png((1000, 1)), 2, max_pixels=10_000_000)
    assert caught.value.code == ErrorCode.INPUT_TOO_COSTLY
    assert "image 2 is 1000×1" in str(caught.value)
    assert decode_image(png(WIDE), 1, max_pixels=10_000_000).image.size == WIDE


def test_side_by_side_stays_within_its_bound() -> None:
    tall, wide = Image.new("RGB", TALL), Image.new("RGB", WIDE)
    # At the first one's height, the wide one alone was 4096 x 131,072 pixels.
    composite = side_by_side([tall, wide, wide], 4096)
    assert composite.height <= 4096 and composite.width <= 4096 + 3
    # Even strips nothing refused (a caller of its own) are bounded.
    strips = side_by_side([Image.new("RGB", (1, 1000)), Image.new("RGB", (1000, 1))], 4096)
    assert strips.width * strips.height <= 4096 * 4097


def test_the_edit_engines_combinations_stay_within_the_output_side() -> None:
    tall, wide = Image.new("RGB", TALL), Image.new("RGB", WIDE)
    limit = 1024
    for made in (row([tall, wide], limit, False), column([wide, tall], limit, False)):
        assert max(made.size) <= limit + 2, made.size
    # A blend covers each input to the first one's size, cropping before it scales.
    assert blend(
        [Image.new("RGB", (32, 1024)), Image.new("RGB", (1024, 32))], None, False
    ).size == (
        32,
        1024,
    )


def test_the_edit_engine_runs_the_worst_shapes_side_by_side() -> None:
    engine = make_engine()
    out, result = run(engine, "put image 1 and image 2 side by side", [png(TALL), png(WIDE)])
    assert out.size == (1024, 1024), out.size
    assert result.info["plan"][0]["op"] == "side_by_side"


@pytest.fixture(scope="module")
def pix2pix(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("weights")
    return build("StableDiffusionInstructPix2PixPipeline", root / "pix2pix")


async def test_a_local_edit_model_composes_the_worst_shapes_within_its_bound(
    pix2pix: Path, tmp_path: Path
) -> None:
    from tests.integration.test_local_models import close, entry, harness_for, run_task

    pipeline = "StableDiffusionInstructPix2PixPipeline"
    h = await harness_for(tmp_path, [entry(pipeline, pix2pix)])
    try:
        model = f"local/{pipeline}"
        payload: dict[str, Any] = {
            "model": model,
            "prompt": "a red square",
            "size": "1024*1024",
            "seed": 7,
            "images": [png_url(TALL), png_url(WIDE), png_url(WIDE)],
        }
        done = await run_task(h, payload)
        assert done["status"] == "completed", done
        refused = await h.submit({**payload, "images": [png_url((1, 1000)), png_url((1000, 1))]})
        assert refused.status_code == 400 and "images[0]" in refused.text
    finally:
        await close(h)


async def test_image_to_video_takes_the_worst_shapes_and_refuses_a_strip(harness: Harness) -> None:
    from tests.integration.test_video import body, run_video

    done = await run_video(harness, images=[png_url(TALL), png_url(WIDE)])
    assert done["status"] == "completed", done
    response = await harness.submit(body(images=[png_url((1000, 1))]), path="generateVideo")
    assert response.status_code == 400 and "images[0]" in response.text
