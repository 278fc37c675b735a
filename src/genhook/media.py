"""Image format sniffing by magic bytes, shared by submit validation and the engines.

The declared MIME type of a data URL or a server's Content-Type is never trusted: the
bytes decide.
"""

from __future__ import annotations

import io
import struct
import threading
from dataclasses import dataclass

ACCEPTED_FORMATS: tuple[str, ...] = ("jpeg", "png", "webp", "bmp", "tiff", "gif", "heic", "heif")

_HEIC_BRANDS = {b"heic", b"heix", b"hevc", b"hevx", b"heim", b"heis", b"hevm", b"hevs"}
_HEIF_BRANDS = {b"mif1", b"msf1", b"heif", b"mif2"}

CONTENT_TYPES: dict[str, str] = {
    "jpeg": "image/jpeg",
    "png": "image/png",
    "webp": "image/webp",
    "bmp": "image/bmp",
    "tiff": "image/tiff",
    "gif": "image/gif",
    "heic": "image/heic",
    "heif": "image/heif",
}


def sniff_image_format(data: bytes | memoryview) -> str | None:
    """Return one of ``ACCEPTED_FORMATS`` for ``data``, or None when it is none of them."""
    head = bytes(data[:32])
    if head.startswith(b"\xff\xd8\xff"):
        return "jpeg"
    if head.startswith(b"\x89PNG\r\n\x1a\n"):
        return "png"
    if len(head) >= 12 and head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        return "webp"
    if head.startswith(b"BM") and len(head) >= 14:
        return "bmp"
    if head[:4] in (b"II*\x00", b"MM\x00*"):
        return "tiff"
    if head[:6] in (b"GIF87a", b"GIF89a"):
        return "gif"
    if len(head) >= 12 and head[4:8] == b"ftyp":
        major = head[8:12]
        if major in _HEIC_BRANDS:
            return "heic"
        if major in _HEIF_BRANDS:
            # A mif1 file is HEIC when a HEVC brand is among its compatible brands.
            box_size = int.from_bytes(data[0:4], "big")
            brands = bytes(data[16 : min(box_size, 256)])
            compatible = {brands[i : i + 4] for i in range(0, len(brands) - 3, 4)}
            return "heic" if compatible & _HEIC_BRANDS else "heif"
    return None


@dataclass(frozen=True, slots=True)
class DecodeLimits:
    """The work one input may cost a decoder, checked from its structure before decoding.

    Pixel count alone does not bound decode time: a progressive JPEG is decoded once per
    scan (about 20 ms per scan at 16 megapixels, and nothing limits the scan count), and a
    PNG costs per chunk. Each decoder counts what multiplies its work and refuses the input
    past these limits with ``INPUT_TOO_COSTLY``; decoders of other media add their own
    counts (frames, duration, sample rate, channels) in the same style.
    """

    max_pixels: int
    max_scans: int = 100
    max_chunks: int = 10_000


def decode_cost_problem(data: bytes, fmt: str, limits: DecodeLimits) -> str | None:
    """Why decoding ``data`` (of sniffed format ``fmt``) would cost too much, or None."""
    if fmt == "jpeg":
        # Entropy-coded data stuffs every 0xFF with 0x00, so FF DA occurs only as a
        # start-of-scan marker (or in an embedded thumbnail, which is counted too).
        scans = data.count(b"\xff\xda")
        if scans > limits.max_scans:
            return f"has {scans} scans; the limit is {limits.max_scans}"
    elif fmt == "png":
        chunks = _png_chunks(data, limits.max_chunks + 1)
        if chunks > limits.max_chunks:
            return f"has more than {limits.max_chunks} chunks"
    return None


def _png_chunks(data: bytes, stop: int) -> int:
    """How many chunks the PNG holds, counting at most ``stop``."""
    count = 0
    pos = 8
    end = len(data)
    while pos + 8 <= end and count < stop:
        (length,) = struct.unpack_from(">I", data, pos)
        count += 1
        if data[pos + 4 : pos + 8] == b"IEND":
            break
        pos += 12 + length
    return count


PIL_FORMATS: dict[str, str] = {
    "jpeg": "JPEG",
    "png": "PNG",
    "webp": "WEBP",
    "bmp": "BMP",
    "tiff": "TIFF",
    "gif": "GIF",
    "heic": "HEIF",
    "heif": "HEIF",
}
# Bytes of an image read for its declared size; each accepted format states it near the start.
HEADER_PROBE_BYTES = 256 * 1024
# What a header too large for Pillow to open at all counts as: more than any budget.
UNOPENABLE_PIXELS = 2**62
# The most one side of an input picture may exceed the other (``aspect_problem``).
MAX_ASPECT_RATIO = 32
# A worker's peak memory per budgeted pixel while it decodes a task's inputs (measured in
# tests/integration/test_decode_memory.py; docs/security.md plans with it). PNG, JPEG and
# the other formats peak at 6 bytes per declared pixel (a 4-byte pixel kept, a transient
# copy); WebP at 10 (libwebp's RGBA frame, Pillow's copy of it and the picture), so the
# budget counts a WebP pixel as 10/6 of one and the bound holds for every format.
DECODE_BYTES_PER_PIXEL = 6
_DECODE_BYTES = {"webp": 10}
_heif_lock = threading.Lock()
_heif_ready = False


def register_heif() -> None:
    """Teach Pillow HEIC/HEIF once per process (pillow-heif ships libheif in its wheel)."""
    global _heif_ready
    with _heif_lock:
        if not _heif_ready:
            import pillow_heif

            pillow_heif.register_heif_opener()
            _heif_ready = True


def declared_size(data: bytes | memoryview) -> tuple[int, int] | None:
    """Width and height as the image's header declares them, read without decoding a
    pixel; None when the header cannot be read (the decoder reports that later), and
    ``(UNOPENABLE_PIXELS, 1)`` for a header too large for Pillow to open at all."""
    fmt = sniff_image_format(data)
    if fmt is None:
        return None
    if fmt == "webp":
        # Pillow's WebP plugin builds a decoder before it reports a size; the header is
        # enough, and libwebp reads it the same way.
        return _webp_size(bytes(data[:30]))
    from PIL import Image

    if fmt in ("heic", "heif"):
        register_heif()
    try:
        with Image.open(
            io.BytesIO(bytes(data[:HEADER_PROBE_BYTES])), formats=[PIL_FORMATS[fmt]]
        ) as image:
            width, height = image.size
    except Image.DecompressionBombError:
        return UNOPENABLE_PIXELS, 1
    except Exception:  # any decoder's idea of a bad header: the full decode names it
        return None
    return max(0, width), max(0, height)


def aspect_problem(size: tuple[int, int]) -> str | None:
    """Why a picture of ``size`` is refused for its shape, or None: one side more than
    ``MAX_ASPECT_RATIO`` times the other. Such a strip is no photograph, and beside other
    inputs (a composite at a common height) it is what makes a few bytes cost gigabytes."""
    width, height = size
    if width <= 0 or height <= 0 or width >= UNOPENABLE_PIXELS:
        return None  # an empty or unopenable header: the pixel checks and the decoder say why
    if max(width, height) <= MAX_ASPECT_RATIO * min(width, height):
        return None
    return (
        f"is {width}×{height}: one side is more than {MAX_ASPECT_RATIO} times the other "
        "(refused before decoding)"
    )


def _webp_size(head: bytes) -> tuple[int, int] | None:
    """Canvas size from a WebP's first chunk: VP8X, VP8L or VP8 (RFC 9649)."""
    if len(head) < 30:
        return None
    kind = head[12:16]
    if kind == b"VP8X":
        return 1 + int.from_bytes(head[24:27], "little"), 1 + int.from_bytes(head[27:30], "little")
    if kind == b"VP8L" and head[20] == 0x2F:
        bits = int.from_bytes(head[21:25], "little")
        return 1 + (bits & 0x3FFF), 1 + ((bits >> 14) & 0x3FFF)
    if kind == b"VP8 " and head[23:26] == b"\x9d\x01\x2a":
        return (
            int.from_bytes(head[26:28], "little") & 0x3FFF,
            int.from_bytes(head[28:30], "little") & 0x3FFF,
        )
    return None


def budgeted_pixels(fmt: str | None, size: tuple[int, int]) -> int:
    """What a picture of ``size`` counts against a task's pixel budget: its pixels, weighed
    by what its format costs to decode (``DECODE_BYTES_PER_PIXEL``)."""
    weight = _DECODE_BYTES.get(fmt or "", DECODE_BYTES_PER_PIXEL)
    return size[0] * size[1] * weight // DECODE_BYTES_PER_PIXEL


def pixel_budget_problem(images: list[bytes | memoryview], budget: int) -> str | None:
    """Why the images of one task would decode to more than ``budget`` pixels together, from
    their headers alone, or None. Each input is decoded whole before any is released, so
    a task's memory follows the sum, not the largest."""
    total = 0
    for image in images:
        size = declared_size(image)
        if size is not None:
            total += budgeted_pixels(sniff_image_format(image), size)
    return pixel_total_problem(total, budget)


def pixel_total_problem(total: int, budget: int) -> str | None:
    """``pixel_budget_problem`` for a total already read from the headers."""
    if total <= budget:
        return None
    shown = "more pixels than can be opened" if total >= UNOPENABLE_PIXELS else f"{total:,} pixels"
    return (
        f"the input images declare {shown} together (a WebP pixel counts as 10/6, for what it "
        f"costs to decode); the limit per task is {budget:,} (GENHOOK_MAX_TASK_INPUT_PIXELS)"
    )
