"""Image format sniffing by magic bytes, shared by submit validation and the engines.

The declared MIME type of a data URL or a server's Content-Type is never trusted: the
bytes decide.
"""

from __future__ import annotations

import struct
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
