"""Inputs that are cheap to send and expensive to decode: progressive JPEGs with many scans,
PNGs with many chunks. Each is a real file of its format that a decoder would work through.
"""

from __future__ import annotations

import io
import struct
import zlib

from PIL import Image


def _progressive_jpeg(size: int) -> bytes:
    picture = Image.effect_noise((size, size), 64).convert("RGB")
    out = io.BytesIO()
    picture.save(out, "JPEG", quality=90, progressive=True)
    return out.getvalue()


def _segments(data: bytes) -> tuple[bytes, list[bytes], bytes]:
    """The header up to the first scan, the scans (SOS segment and entropy data), the tail."""
    first = data.index(b"\xff\xda")
    scans: list[bytes] = []
    pos = first
    while True:
        if data[pos : pos + 2] != b"\xff\xda":
            break
        end = pos + 2
        while True:
            end = data.index(b"\xff", end)
            following = data[end + 1]
            if following == 0 or 0xD0 <= following <= 0xD7:
                end += 2
                continue
            break
        scans.append(data[pos:end])
        # Tables (DHT) may sit between scans; keep them with the next scan.
        while data[end : end + 2] not in (b"\xff\xda", b"\xff\xd9"):
            (length,) = struct.unpack(">H", data[end + 2 : end + 4])
            scans[-1] += data[end : end + 2 + length]
            end += 2 + length
        pos = end
    return data[:first], scans, data[pos:]


def many_scan_jpeg(scans: int, size: int = 256) -> bytes:
    """A progressive JPEG with ``scans`` scans: its own, then its smallest one repeated
    (each repeat is a few bytes per block, and a full pass over the picture to decode)."""
    head, own, tail = _segments(_progressive_jpeg(size))
    cheapest = min(own, key=len)
    body = own[:scans] + [cheapest] * max(0, scans - len(own))
    return head + b"".join(body) + tail


def jpeg_scan_count(data: bytes) -> int:
    return len(_segments(data)[1])


def _chunk(kind: bytes, payload: bytes) -> bytes:
    crc = zlib.crc32(kind + payload) & 0xFFFFFFFF
    return struct.pack(">I", len(payload)) + kind + payload + struct.pack(">I", crc)


def many_chunk_png(chunks: int, size: int = 16) -> bytes:
    """A valid PNG with ``chunks`` chunks in all: the picture's, plus private ancillary ones."""
    out = io.BytesIO()
    Image.new("RGB", (size, size), (10, 200, 30)).save(out, "PNG")
    data = out.getvalue()
    iend = data.rindex(b"IEND") - 4
    own = 3  # IHDR, IDAT, IEND
    filler = _chunk(b"gnHk", b"") * max(0, chunks - own)
    return data[:iend] + filler + data[iend:]
