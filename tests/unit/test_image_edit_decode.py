"""Input decoding: all eight formats, orientation, modes, and hostile or broken inputs."""

from __future__ import annotations

import io
import struct
import zlib

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image

from genhook.engines.media.decode import decode_image, register_heif
from genhook.errors import ErrorCode, TaskFailure
from tests.unit.image_edit_fixtures import BLUE, GREEN, RED, YELLOW, close, encode, mean, quadrants

LIMIT = 40_000_000


def heic_bytes(image: Image.Image) -> bytes:
    register_heif()
    return encode(image, "HEIF", quality=95)


def heif_bytes(image: Image.Image) -> bytes:
    """A HEIF whose brands do not name HEVC ("mif1" only), as some cameras write."""
    data = bytearray(heic_bytes(image))
    assert data[4:8] == b"ftyp" and int.from_bytes(data[0:4], "big") == 28
    data[8:12] = b"mif1"
    data[16:28] = b"mif1miafmiaf"
    return bytes(data)


def format_bytes(fmt: str, image: Image.Image) -> bytes:
    if fmt == "heic":
        return heic_bytes(image)
    if fmt == "heif":
        return heif_bytes(image)
    if fmt == "gif":
        return encode(image.quantize(colors=8), "GIF")
    options = {"jpeg": {"quality": 95}, "webp": {"quality": 95}}.get(fmt, {})
    return encode(image, fmt.upper(), **options)


@pytest.mark.parametrize("fmt", ["jpeg", "png", "webp", "bmp", "tiff", "gif", "heic", "heif"])
def test_every_accepted_format_decodes_to_the_right_pixels(fmt: str) -> None:
    source = quadrants((96, 64))
    decoded = decode_image(format_bytes(fmt, source), 1, max_pixels=LIMIT)
    assert decoded.format == fmt
    assert decoded.image.size == (96, 64)
    assert decoded.image.mode == "RGB"
    picture = decoded.image
    assert close(mean(picture, (8, 8, 40, 24)), RED)
    assert close(mean(picture, (56, 8, 88, 24)), GREEN)
    assert close(mean(picture, (8, 40, 40, 56)), BLUE)
    assert close(mean(picture, (56, 40, 88, 56)), YELLOW)


def test_exif_orientation_is_applied() -> None:
    source = quadrants((96, 64))
    exif = Image.Exif()
    exif[0x0112] = 6  # stored rotated: display needs a 90° clockwise turn
    data = encode(source, "JPEG", quality=95, exif=exif.tobytes())
    decoded = decode_image(data, 1, max_pixels=LIMIT)
    assert decoded.image.size == (64, 96)
    # After a clockwise turn the stored top-left (red) is at the top right.
    assert close(mean(decoded.image, (40, 8, 56, 40)), RED)


def test_gif_uses_the_first_frame() -> None:
    frames = [Image.new("RGB", (32, 32), color).convert("P") for color in (RED, GREEN, BLUE)]
    buffer = io.BytesIO()
    frames[0].save(buffer, "GIF", save_all=True, append_images=frames[1:], duration=50)
    decoded = decode_image(buffer.getvalue(), 1, max_pixels=LIMIT)
    assert decoded.animated
    assert close(mean(decoded.image, (0, 0, 32, 32)), RED, tol=10)


def test_palette_with_transparency_becomes_rgba() -> None:
    image = Image.new("P", (16, 16), 0)
    image.putpalette([255, 0, 0, 0, 255, 0] + [0] * 762)
    image.paste(1, (8, 0, 16, 16))
    data = encode(image, "PNG", transparency=1)
    decoded = decode_image(data, 1, max_pixels=LIMIT)
    assert decoded.image.mode == "RGBA"
    alpha = np.asarray(decoded.image.getchannel("A"))
    assert alpha[:, :8].min() == 255 and alpha[:, 8:].max() == 0


def test_sixteen_bit_grayscale_is_scaled_not_clipped() -> None:
    ramp = (np.arange(64, dtype=np.uint16)[None, :].repeat(8, axis=0) * 1024).astype(np.uint16)
    data = encode(Image.fromarray(ramp), "PNG")
    decoded = decode_image(data, 1, max_pixels=LIMIT)
    array = np.asarray(decoded.image)
    assert decoded.image.mode == "RGB"
    assert array[0, 0, 0] == 0
    assert 240 <= array[0, 63, 0] <= 255  # 64512/65535 of full scale, not a clipped 255 row
    assert 120 <= array[0, 32, 0] <= 136


def test_cmyk_jpeg_becomes_rgb() -> None:
    data = encode(Image.new("CMYK", (16, 16), (0, 255, 255, 0)), "JPEG", quality=95)
    decoded = decode_image(data, 1, max_pixels=LIMIT)
    assert decoded.image.mode == "RGB"
    assert close(mean(decoded.image, (0, 0, 16, 16)), (255, 0, 0), tol=40)


@pytest.mark.parametrize("mode", ["L", "LA", "1", "RGBA"])
def test_other_modes_normalize_to_rgb_or_rgba(mode: str) -> None:
    data = encode(Image.new(mode, (8, 8)), "PNG")
    decoded = decode_image(data, 1, max_pixels=LIMIT)
    assert decoded.image.mode == ("RGBA" if mode in ("LA", "RGBA") else "RGB")


def test_wrong_magic_is_unsupported_format() -> None:
    with pytest.raises(TaskFailure) as info:
        decode_image(b"%PDF-1.7 not an image at all", 2, max_pixels=LIMIT)
    assert info.value.code == ErrorCode.INPUT_UNSUPPORTED_FORMAT
    assert "image 2" in info.value.message


@pytest.mark.parametrize("fmt", ["jpeg", "png", "webp", "gif", "tiff", "heic"])
def test_truncated_files_are_corrupt(fmt: str) -> None:
    data = format_bytes(fmt, quadrants((128, 128)))
    with pytest.raises(TaskFailure) as info:
        decode_image(data[: len(data) // 2], 1, max_pixels=LIMIT)
    assert info.value.code == ErrorCode.INPUT_CORRUPT


def _png_chunk(kind: bytes, body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))


def png_declaring(width: int, height: int) -> bytes:
    """A tiny PNG whose header declares ``width``×``height``; its pixel data is garbage, so
    it can only fail as too many pixels if it is refused before any decoding."""
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + _png_chunk(b"IHDR", header)
        + _png_chunk(b"IDAT", zlib.compress(b"\x00" * 64))
        + _png_chunk(b"IEND", b"")
    )


def test_decompression_bomb_is_refused_before_decoding() -> None:
    data = png_declaring(50_000, 50_000)
    assert len(data) < 200
    with pytest.raises(TaskFailure) as info:
        decode_image(data, 1, max_pixels=LIMIT)
    assert info.value.code == ErrorCode.INPUT_TOO_MANY_PIXELS


def test_own_pixel_limit_applies_below_pillows_bomb_limit() -> None:
    data = png_declaring(3000, 3000)  # 9 MP: far below Pillow's own bomb threshold
    with pytest.raises(TaskFailure) as info:
        decode_image(data, 3, max_pixels=1_000_000)
    assert info.value.code == ErrorCode.INPUT_TOO_MANY_PIXELS
    assert "3000×3000" in info.value.message and "image 3" in info.value.message


def test_jpeg_reduction_decodes_big_pictures_smaller() -> None:
    data = encode(quadrants((2048, 2048)), "JPEG", quality=90)
    decoded = decode_image(data, 1, max_pixels=LIMIT, reduce_to=512)
    assert decoded.width == 2048
    assert 512 <= decoded.image.width < 2048
    assert close(mean(decoded.image, (0, 0, 200, 200)), RED)


_MAGICS = [
    b"\xff\xd8\xff\xe0",
    b"\x89PNG\r\n\x1a\n",
    b"RIFF\x10\x00\x00\x00WEBPVP8 ",
    b"BM" + b"\x00" * 12,
    b"II*\x00",
    b"MM\x00*",
    b"GIF89a",
    b"\x00\x00\x00\x18ftypheic\x00\x00\x00\x00mif1heic",
]


@pytest.mark.filterwarnings("ignore::UserWarning")
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(magic=st.sampled_from(_MAGICS), tail=st.binary(max_size=300))
def test_garbage_behind_valid_magic_fails_cleanly(magic: bytes, tail: bytes) -> None:
    try:
        decoded = decode_image(magic + tail, 1, max_pixels=LIMIT)
    except TaskFailure as failure:
        assert failure.code in {
            ErrorCode.INPUT_CORRUPT,
            ErrorCode.INPUT_UNSUPPORTED_FORMAT,
            ErrorCode.INPUT_TOO_MANY_PIXELS,
        }
    else:
        assert decoded.image.mode in ("RGB", "RGBA")


@settings(max_examples=40, deadline=None)
@given(cut=st.integers(min_value=1, max_value=400), flips=st.lists(st.integers(0, 399), max_size=6))
def test_damaged_real_files_fail_cleanly(cut: int, flips: list[int]) -> None:
    data = bytearray(encode(quadrants((40, 30)), "PNG"))
    for position in flips:
        if position < len(data):
            data[position] ^= 0x5A
    try:
        decode_image(bytes(data[: max(8, len(data) - cut)]), 1, max_pixels=LIMIT)
    except TaskFailure as failure:
        assert failure.code in {
            ErrorCode.INPUT_CORRUPT,
            ErrorCode.INPUT_UNSUPPORTED_FORMAT,
            ErrorCode.INPUT_TOO_MANY_PIXELS,
        }


def test_multi_page_tiff_uses_the_first_page() -> None:
    pages = [Image.new("RGB", (24, 24), color) for color in (GREEN, RED)]
    buffer = io.BytesIO()
    pages[0].save(buffer, "TIFF", save_all=True, append_images=pages[1:])
    decoded = decode_image(buffer.getvalue(), 1, max_pixels=LIMIT)
    assert decoded.animated
    assert close(mean(decoded.image, (0, 0, 24, 24)), GREEN, tol=2)
