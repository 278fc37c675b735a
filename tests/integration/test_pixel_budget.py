"""A task's input images are budgeted in decoded pixels all together: a few bytes of WebP
can declare tens of megapixels each, so ten of them would take a worker gigabytes."""

from __future__ import annotations

import base64
import struct

import pytest

from genhook.engines.media.decode import check_pixel_budget
from genhook.errors import ErrorCode, TaskFailure
from tests.conftest import Harness
from tests.support.images import data_url


def declared_webp(width: int, height: int) -> bytes:
    """A lossless WebP header declaring ``width`` x ``height``, with no picture behind it."""
    payload = b"\x2f" + struct.pack("<I", (width - 1) | ((height - 1) << 14)) + bytes(16)
    chunk = b"VP8L" + struct.pack("<I", len(payload)) + payload
    return b"RIFF" + struct.pack("<I", 4 + len(chunk)) + b"WEBP" + chunk


def webp_url(width: int, height: int) -> str:
    return "data:image/webp;base64," + base64.b64encode(declared_webp(width, height)).decode()


async def test_submit_refuses_inputs_declaring_more_pixels_than_a_task_may_decode(
    harness: Harness,
) -> None:
    # 36 megapixels each is under the per-image limit; three of them are over the task's,
    # counted at what WebP costs to decode (10/6 of a pixel each).
    big = webp_url(6000, 6000)
    body = {"model": "test/fake-edit", "prompt": "x", "images": [big, big, big]}
    response = await harness.submit(body)
    assert response.status_code == 400, response.text
    error = response.json()["errors"][0]
    assert error["field"] == "images"
    assert "180,000,000 pixels" in error["message"]
    # A header too large to open at all is refused the same way.
    huge = {"model": "test/fake-edit", "prompt": "x", "images": [webp_url(16000, 16000)]}
    assert (await harness.submit(huge)).status_code == 400
    # Within the budget, the task is accepted.
    fine = {"model": "test/fake-edit", "prompt": "x", "images": [big, data_url()]}
    assert (await harness.submit(fine)).status_code == 200


def test_a_worker_refuses_the_same_before_decoding_fetched_images() -> None:
    images = [declared_webp(6000, 6000)] * 3
    with pytest.raises(TaskFailure) as caught:
        check_pixel_budget(images, 100_000_000)
    assert caught.value.code == ErrorCode.INPUT_TOO_MANY_PIXELS
    check_pixel_budget(images[:1], 100_000_000)
    # Two are 72 megapixels, counted as 120 million for what WebP costs to decode.
    with pytest.raises(TaskFailure):
        check_pixel_budget(images[:2], 100_000_000)
