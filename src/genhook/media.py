"""Image format sniffing by magic bytes, shared by submit validation and the engines.

The declared MIME type of a data URL or a server's Content-Type is never trusted: the
bytes decide.
"""

from __future__ import annotations

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


def sniff_image_format(data: bytes) -> str | None:
    """Return one of ``ACCEPTED_FORMATS`` for ``data``, or None when it is none of them."""
    head = data[:32]
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
            brands = data[16 : min(box_size, 256)]
            compatible = {brands[i : i + 4] for i in range(0, len(brands) - 3, 4)}
            return "heic" if compatible & _HEIC_BRANDS else "heif"
    return None
