"""``genhook/image-to-video`` end to end on SQLite and PostgreSQL: submit, the real engine in
the worker, the MP4 decoded with PyAV, motion and transitions measured on the frames, Range
requests on the output, failures, billing and deadlines."""

from __future__ import annotations

import base64
import io
import itertools
import struct
import zlib
from decimal import Decimal
from typing import Any
from urllib.parse import urlsplit

import av
import numpy as np
import pytest
from PIL import Image, ImageDraw

from genhook.db import Task
from genhook.errors import ErrorCode
from tests.conftest import Harness, make_harness, make_settings

VIDEO = "genhook/image-to-video"


def picture(
    size: tuple[int, int] = (320, 240),
    disc: tuple[int, int, int] = (230, 20, 20),
    background: tuple[int, int, int] = (40, 40, 40),
    radius: int = 40,
    centre: tuple[int, int] | None = None,
) -> str:
    image = Image.new("RGB", size, background)
    cx, cy = centre or (size[0] // 2, size[1] // 2)
    if radius:
        ImageDraw.Draw(image).ellipse((cx - radius, cy - radius, cx + radius, cy + radius), disc)
    buffer = io.BytesIO()
    image.save(buffer, "PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


def body(**overrides: Any) -> dict[str, Any]:
    values: dict[str, Any] = {
        "model": VIDEO,
        "prompt": "zoom in",
        "images": [picture()],
        "duration": 1,
        "resolution": "480p",
        "fps": 24,
    }
    values.update(overrides)
    return values


async def run_video(harness: Harness, **overrides: Any) -> dict[str, Any]:
    response = await harness.submit(body(**overrides), path="generateVideo")
    assert response.status_code == 200, response.text
    task_id = response.json()["id"]
    assert await harness.run_all() == 1
    return await harness.result(task_id)


async def download(harness: Harness, url: str, **headers: str) -> Any:
    return await harness.client.get(urlsplit(url).path, headers=headers)


def decode(data: bytes) -> tuple[Any, list[np.ndarray[Any, Any]]]:
    """Stream facts and every frame as RGB."""
    with av.open(io.BytesIO(data)) as container:
        stream = container.streams.video[0]
        facts = {
            "codec": stream.codec_context.name,
            "pix_fmt": stream.codec_context.pix_fmt,
            "width": stream.codec_context.width,
            "height": stream.codec_context.height,
            "rate": stream.average_rate,
            "duration": float(container.duration or 0) / 1_000_000,
        }
        frames = [frame.to_ndarray(format="rgb24") for frame in container.decode(stream)]
    return facts, frames


async def video_frames(
    harness: Harness, result: dict[str, Any]
) -> tuple[Any, list[np.ndarray[Any, Any]]]:
    """Download a completed task's MP4 and decode it; every video the tests make is held to
    what its ``info`` promises: H.264, yuv420p, the size, the frame count and the length."""
    assert result["status"] == "completed", result
    info = result["info"]
    facts, frames = decode((await download(harness, result["outputs"][0])).content)
    assert facts["codec"] == "h264" and facts["pix_fmt"] == "yuv420p"
    assert f"{facts['width']}*{facts['height']}" == info["size"]
    assert facts["rate"] == info["fps"]
    assert len(frames) == info["frames"] == info["duration"] * info["fps"]
    assert facts["duration"] == pytest.approx(info["duration"], abs=0.05)
    return facts, frames


def red_area(frame: np.ndarray[Any, Any]) -> int:
    r, g, b = (frame[:, :, i].astype(int) for i in range(3))
    return int(np.count_nonzero((r > 150) & (g < 90) & (b < 90)))


def red_centroid_x(frame: np.ndarray[Any, Any]) -> float:
    r, g, b = (frame[:, :, i].astype(int) for i in range(3))
    _ys, xs = np.nonzero((r > 150) & (g < 90) & (b < 90))
    return float(xs.mean())


async def test_video_is_an_h264_mp4_of_the_exact_size_rate_and_length(harness: Harness) -> None:
    result = await run_video(
        harness,
        prompt="zoom in, black and white, add a red border",
        duration=2,
        aspect_ratio="16:9",
    )
    assert result["status"] == "completed", result
    assert result["has_nsfw_contents"] == [False]
    info = result["info"]
    assert [step["op"] for step in info["plan"]] == ["zoom_in", "grayscale", "border"]
    assert info["size"] == "854*480" and info["frames"] == 48
    response = await download(harness, result["outputs"][0])
    assert response.status_code == 200
    assert response.headers["content-type"] == "video/mp4"
    assert response.headers["accept-ranges"] == "bytes"
    data = response.content
    # +faststart: the index comes before the media, so playback starts while downloading.
    assert 0 <= data.find(b"moov") < data.find(b"mdat")
    facts, frames = decode(data)
    assert facts["codec"] == "h264" and facts["pix_fmt"] == "yuv420p"
    assert (facts["width"], facts["height"]) == (854, 480)
    assert facts["rate"] == 24
    assert len(frames) == 48
    assert facts["duration"] == pytest.approx(2.0, abs=0.05)
    middle = frames[24]
    # Black and white inside a red border.
    assert middle[240, 4, 0] > 180 and middle[240, 4, 1] < 60
    inner = middle[40:-40, 40:-40].astype(int)
    assert np.abs(inner[:, :, 0] - inner[:, :, 1]).max() <= 12


async def test_portrait_frames_with_a_rotation_and_a_caption(harness: Harness) -> None:
    # 854 rows: chroma planes of an odd number of rows in the encoder's layout.
    result = await run_video(
        harness,
        prompt='rotate 20 degrees counterclockwise, add the caption "hi" in yellow',
        aspect_ratio="9:16",
        fps=30,
    )
    assert result["status"] == "completed", result
    assert result["info"]["plan"][0] == {
        "op": "rotate",
        "degrees": 20.0,
        "direction": "counterclockwise",
        "from": "rotate 20 degrees counterclockwise",
    }
    facts, frames = await video_frames(harness, result)
    assert (facts["width"], facts["height"]) == (480, 854) and len(frames) == 30
    # Yellow caption letters near the bottom, on every frame.
    bottom = frames[15][-160:].astype(int)
    assert np.count_nonzero(
        (bottom[:, :, 0] > 200) & (bottom[:, :, 1] > 200) & (bottom[:, :, 2] < 90)
    )


async def test_zoom_in_grows_the_central_object_frame_over_frame(harness: Harness) -> None:
    result = await run_video(harness, prompt="slowly zoom in", aspect_ratio="4:3")
    assert result["info"]["plan"][0]["op"] == "zoom_in"
    _, frames = await video_frames(harness, result)
    areas = [red_area(frames[i]) for i in (0, 6, 12, 18, 23)]
    assert all(a < b for a, b in itertools.pairwise(areas)), areas
    assert areas[-1] > 1.4 * areas[0], areas


async def test_zoom_out_and_pan_move_the_way_the_plan_says(harness: Harness) -> None:
    out = await run_video(harness, prompt="zoom out", aspect_ratio="4:3")
    _, frames = await video_frames(harness, out)
    areas = [red_area(frames[i]) for i in (0, 12, 23)]
    assert areas[0] > areas[1] > areas[2], areas

    # The camera pans left, so the scene travels right across the frame.
    pan = await run_video(harness, prompt="pan left", aspect_ratio="4:3")
    assert pan["info"]["plan"][0] == {"op": "pan", "direction": "left", "from": "pan left"}
    _, frames = await video_frames(harness, pan)
    xs = [red_centroid_x(frames[i]) for i in (0, 12, 23)]
    assert xs[0] < xs[1] < xs[2], xs
    assert xs[2] - xs[0] > 20


async def test_crossfade_mixes_the_two_images_at_the_boundary(harness: Harness) -> None:
    red = picture(background=(220, 20, 20), radius=0)
    blue = picture(background=(20, 20, 220), radius=0)
    result = await run_video(
        harness, prompt="a slideshow with crossfade transitions", images=[red, blue], duration=2
    )
    info = result["info"]
    assert info["transition"] == "crossfade"
    _, frames = await video_frames(harness, result)
    means = [frame.reshape(-1, 3).mean(axis=0) for frame in frames]
    assert means[0][0] > 180 and means[0][2] < 60  # red alone
    assert means[-1][2] > 180 and means[-1][0] < 60  # blue alone
    mixed = [m for m in means if 70 < m[0] < 170 and 70 < m[2] < 170]
    assert mixed, "no frame mixes the two images"
    # The mix moves from red to blue, frame after frame.
    reds = [m[0] for m in means[18:30]]
    assert all(a >= b - 2 for a, b in itertools.pairwise(reds)), reds


async def test_wipe_reveals_the_next_image_from_the_left(harness: Harness) -> None:
    red = picture(background=(220, 20, 20), radius=0)
    blue = picture(background=(20, 20, 220), radius=0)
    result = await run_video(harness, prompt="wipe", images=[red, blue], duration=2)
    _, frames = await video_frames(harness, result)
    middle = frames[24]
    width = middle.shape[1]
    assert middle[:, : width // 8, 2].mean() > 180  # left: the next image
    assert middle[:, -width // 8 :, 0].mean() > 180  # right: still the first


async def test_no_recognised_motion_gives_a_default_and_says_so(harness: Harness) -> None:
    result = await run_video(harness, prompt="something lovely", aspect_ratio=None)
    facts, _ = await video_frames(harness, result)
    assert (facts["width"], facts["height"]) == (640, 480)
    info = result["info"]
    assert "default" in info["motion"]
    assert any("default motion" in note for note in info["notes"])
    assert info["aspect_ratio"] == {"value": "4:3", "why": "nearest to the first image"}


async def test_output_answers_range_requests(harness: Harness) -> None:
    result = await run_video(harness)
    await video_frames(harness, result)
    url = result["outputs"][0]
    whole = (await download(harness, url)).content
    size = len(whole)
    first = await download(harness, url, Range="bytes=0-99")
    assert first.status_code == 206
    assert first.content == whole[:100]
    assert first.headers["content-range"] == f"bytes 0-99/{size}"
    assert first.headers["content-type"] == "video/mp4"
    tail = await download(harness, url, Range="bytes=-50")
    assert tail.status_code == 206 and tail.content == whole[-50:]
    rest = await download(harness, url, Range=f"bytes={size - 10}-")
    assert rest.status_code == 206 and rest.content == whole[-10:]
    past = await download(harness, url, Range=f"bytes={size}-")
    assert past.status_code == 416
    assert past.headers["content-range"] == f"bytes */{size}"
    assert past.json()["code"] == 416
    several = await download(harness, url, Range="bytes=0-1,5-6")
    assert several.status_code == 200 and several.content == whole


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"duration": 0}, "duration"),
        ({"duration": 31}, "duration"),
        ({"duration": "5"}, "duration"),
        ({"duration": 2.5}, "duration"),
        ({"resolution": "4k"}, "resolution"),
        ({"aspect_ratio": "2:1"}, "aspect_ratio"),
        ({"fps": 25}, "fps"),
        ({"images": []}, "images"),
        ({"images": [picture()] * 11}, "images"),
        ({"images": ["ftp://example.test/a.png"]}, "images[0]"),
        ({"prompt": ""}, "prompt"),
        ({"size": "1024*1024"}, "size"),
    ],
)
async def test_bad_fields_are_400_naming_the_field(
    harness: Harness, overrides: dict[str, Any], field: str
) -> None:
    response = await harness.submit(body(**overrides), path="generateVideo")
    assert response.status_code == 400, response.text
    assert field in {error["field"] for error in response.json()["errors"]}
    async with harness.state.db.read() as session:
        assert (await session.get(Task, "x")) is None


async def test_video_model_is_refused_on_the_image_path(harness: Harness) -> None:
    response = await harness.submit(body(), path="generateImage")
    assert response.status_code == 400
    assert "/api/v1/model/generateVideo" in response.json()["errors"][0]["message"]


def _truncated(url: str) -> str:
    head, _, payload = url.partition(",")
    return head + "," + base64.b64encode(base64.b64decode(payload)[:120]).decode()


def _png_chunk(kind: bytes, payload: bytes) -> bytes:
    return (
        struct.pack(">I", len(payload))
        + kind
        + payload
        + struct.pack(">I", zlib.crc32(kind + payload))
    )


def _png_declaring(width: int, height: int) -> str:
    """A tiny PNG that declares a huge picture: a decompression bomb."""
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    data = (
        b"\x89PNG\r\n\x1a\n"
        + _png_chunk(b"IHDR", header)
        + _png_chunk(b"IDAT", zlib.compress(b"\x00" * 64))
        + _png_chunk(b"IEND", b"")
    )
    return "data:image/png;base64," + base64.b64encode(data).decode()


@pytest.mark.parametrize(
    ("overrides", "code"),
    [
        ({"images": [_truncated(picture())]}, ErrorCode.INPUT_CORRUPT),
        # Over the per-image limit (40 MP), within the task's budget (100 MP): the submit
        # takes it, the engine refuses it before decoding. (Past the budget, the submit
        # refuses it: tests/integration/test_pixel_budget.py.)
        ({"images": [_png_declaring(8_000, 8_000)]}, ErrorCode.INPUT_TOO_MANY_PIXELS),
        ({"prompt": "zoom in and undress her"}, ErrorCode.MODERATION_PROMPT_BLOCKED),
        ({"prompt": "zoom in, put the images side by side"}, ErrorCode.INSTRUCTION_INVALID),
    ],
)
async def test_hostile_inputs_end_failed_with_their_code(
    harness: Harness, overrides: dict[str, Any], code: ErrorCode
) -> None:
    result = await run_video(harness, **overrides)
    assert result["status"] == "failed", result
    assert result["error_code"] == int(code), result


async def test_billed_per_second_by_resolution(harness: Harness) -> None:
    result = await run_video(harness, duration=2, resolution="480p")
    await video_frames(harness, result)
    usage = (await harness.client.get("/api/v1/usage", headers=harness.headers)).json()
    item = usage["items"][0]
    assert item["model"] == VIDEO and item["tier"] == "480p"
    assert item["lines"] == [["2 s of 480p video at 0.010 USD/s", "0.020"]]
    assert Decimal(usage["total_usd"]) == Decimal("0.02")


async def test_a_video_past_its_deadline_ends_timeout(tmp_path: Any, database_url: str) -> None:
    # No start margin: the worker takes the task and the engine meets the deadline mid-run.
    settings = make_settings(
        tmp_path, database_url, task_deadline_seconds=2, task_start_margin_seconds=0
    )
    harness = await make_harness(settings)
    try:
        result = await run_video(harness, duration=30, resolution="1080p", fps=30)
        assert result["status"] == "failed"  # "timeout" on the wire is reported as failed
        assert result["error_code"] == int(ErrorCode.TIMEOUT)
        async with harness.state.db.read() as session:
            task = await session.get(Task, result["id"])
            assert task is not None and task.status == "timeout"
            assert task.outputs == []
    finally:
        await harness.client.aclose()
        await harness.state.db.dispose()


async def test_base64_output_is_the_mp4_itself(harness: Harness) -> None:
    result = await run_video(harness, enable_base64_output=True)
    assert result["status"] == "completed", result
    data = base64.b64decode(result["outputs"][0], validate=True)
    facts, frames = decode(data)
    assert facts["codec"] == "h264" and len(frames) == result["info"]["frames"] == 24


async def test_the_engine_reports_each_second_of_video_it_encodes(harness: Harness) -> None:
    result = await run_video(harness, duration=2)
    assert result["status"] == "completed", result
    response = await harness.client.get(
        f"/api/v1/model/result/{result['id']}", params={"logs": "1"}, headers=harness.headers
    )
    lines = [line["message"] for line in response.json()["logs"]]
    size = result["info"]["size"]
    assert lines[0] == f"prepared 1 still(s) for {size}"
    assert lines[1:3] == ["encoded 24 of 48 frames", "encoded 48 of 48 frames"]
    assert lines[3].startswith("encoded the MP4, ")
