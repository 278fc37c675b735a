"""Audio container sniffing by magic bytes: the bytes decide, never a declared type."""

from __future__ import annotations

# Containers accepted as speech-to-text input; video containers carry an audio track.
AUDIO_CONTENT_TYPES: dict[str, str] = {
    "wav": "audio/wav",
    "mp3": "audio/mpeg",
    "ogg": "audio/ogg",
    "flac": "audio/flac",
    "mp4": "audio/mp4",
    "webm": "audio/webm",
    "aac": "audio/aac",
}

_MP4_VIDEO_BRANDS = {b"heic", b"heix", b"hevc", b"hevx", b"heim", b"heis", b"mif1", b"msf1"}


def sniff_audio_format(data: bytes | memoryview) -> str | None:
    """One of ``AUDIO_CONTENT_TYPES``' keys for ``data``, or None when it is none of them."""
    head = bytes(data[:16])
    if len(head) >= 12 and head[:4] == b"RIFF" and head[8:12] == b"WAVE":
        return "wav"
    if head.startswith(b"OggS"):
        return "ogg"
    if head.startswith(b"fLaC"):
        return "flac"
    if head.startswith(b"\x1a\x45\xdf\xa3"):
        return "webm"  # Matroska and WebM share the EBML header
    if len(head) >= 12 and head[4:8] == b"ftyp" and head[8:12] not in _MP4_VIDEO_BRANDS:
        return "mp4"
    if head.startswith(b"ID3"):
        return "mp3"
    if len(head) >= 2 and head[0] == 0xFF and head[1] & 0xF6 == 0xF0:
        return "aac"  # ADTS: sync word, layer 0
    if len(head) >= 2 and head[0] == 0xFF and head[1] & 0xE0 == 0xE0:
        return "mp3"  # MPEG audio frame sync
    return None
