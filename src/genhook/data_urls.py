"""Base64 data URLs of input files, decoded without ever becoming one large Python string.

The body parser (``genhook.api.bodies``) leaves each data URL of an input field (``images``
items, ``audio``) in the request body's bytes and gives the request schemas a short
placeholder for it; ``decode_data_url`` reads the header and decodes the payload straight
from those bytes, 256 KiB at a time. A 60 MB data URL so costs no single interpreter call of
more than about a millisecond, and the event loop, which needs the interpreter lock between
those calls, keeps answering other requests while a thread decodes.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import mmap
import re
import time
from collections.abc import Iterator
from typing import Any

HEADER_RE = re.compile(r"^data:([a-zA-Z0-9.+/-]*)((?:;[a-zA-Z0-9=._-]+)*);base64,", re.DOTALL)
_HEADER_BYTES_RE = re.compile(HEADER_RE.pattern.encode("ascii"), re.DOTALL)
# The validation context key under which a request's ``InlineData`` travels.
INLINE_DATA = "inline_data"
# The fields whose data URLs stay in the body's bytes: ``images`` items and ``audio``.
INPUT_FIELDS = ("images", "audio")
FORM_ERROR = "a data URL must have the form data:<mime>;base64,<data>"
BASE64_ERROR = "the data URL's base64 payload is not valid base64"
STEP = 256 * 1024  # a multiple of 4
# A header (up to the first comma) longer than this is refused as malformed unread.
MAX_HEADER_BYTES = STEP
_ESCAPED_SLASH = b"\\/"
# A request body's bytes: a large one is read into an anonymous memory map.
Buffer = bytes | bytearray | mmap.mmap


class InlineData:
    """The data URLs of one request body, left in its bytes as ``(start, end)`` spans.

    ``placeholder(i)`` is the string that stands for span ``i`` in the parsed body; it holds
    a random token, so a client cannot spell one. Inside a span, ``\\/`` means ``/`` (JSON
    encoders may escape slashes); the body parser has already refused non-ASCII spans.
    """

    def __init__(self, raw: Buffer, token: str, spans: list[tuple[int, int]]) -> None:
        self.raw = raw
        self.token = token
        self.spans = spans
        # The spans placeholders may stand for; the body parser narrows it to input fields'.
        self.kept = set(range(len(spans)))

    def placeholder(self, index: int) -> str:
        return f"{self.token}{index}"

    def index(self, value: str) -> int | None:
        """The span ``value`` is the placeholder of, if it is one."""
        if not value.startswith(self.token):
            return None
        digits = value[len(self.token) :]
        if digits.isdigit() and len(digits) < 8 and int(digits) in self.kept:
            return int(digits)
        return None

    def span(self, value: str) -> tuple[int, int] | None:
        index = self.index(value)
        return None if index is None else self.spans[index]

    def decode(self, span: tuple[int, int]) -> memoryview:
        """The decoded payload of the data URL at ``span``; ValueError as ``decode_data_url``."""
        start, end = span
        comma = find(self.raw, b",", start, min(end, start + MAX_HEADER_BYTES))
        if comma < 0:
            raise ValueError(FORM_ERROR)
        header = bytes(self.raw[start : comma + 1]).replace(_ESCAPED_SLASH, b"/")
        if not _HEADER_BYTES_RE.match(header):
            raise ValueError(FORM_ERROR)
        return _decode(self.raw, comma + 1, end, escaped=True)

    def text_pieces(self, span: tuple[int, int]) -> Iterator[str]:
        """The span's string value in pieces of about ``STEP`` characters."""
        for piece in _pieces(self.raw, *span, escaped=True):
            yield piece.decode("ascii")

    def digest(self, canonical: str) -> str:
        """SHA-256 of ``canonical`` (JSON holding placeholders) with each placeholder replaced
        by its string, hashed piece by piece: the same value ``json.dumps`` of the real body
        would hash to."""
        sha = hashlib.sha256()
        pattern = re.compile('"' + re.escape(self.token) + r'(\d+)"')
        last = 0
        for match in pattern.finditer(canonical):
            index = int(match.group(1))
            if index not in self.kept:
                continue
            sha.update(canonical[last : match.start()].encode("utf-8"))
            sha.update(b'"')
            for piece in self.text_pieces(self.spans[index]):
                sha.update(json.dumps(piece, ensure_ascii=False)[1:-1].encode("utf-8"))
            sha.update(b'"')
            last = match.end()
        sha.update(canonical[last:].encode("utf-8"))
        return sha.hexdigest()


def inline_data(context: Any) -> InlineData | None:
    """The request's ``InlineData`` from a validation context, if it has one."""
    inline = context.get(INLINE_DATA) if isinstance(context, dict) else None
    return inline if isinstance(inline, InlineData) else None


def is_data_url(value: str, inline: InlineData | None) -> bool:
    return value.startswith("data:") or (inline is not None and inline.span(value) is not None)


def decode_data_url(value: str, inline: InlineData | None = None) -> bytes | memoryview:
    """The bytes of the base64 data URL ``value``, or of the one its placeholder stands for.

    Raises ValueError with the message a client sees.
    """
    span = inline.span(value) if inline is not None else None
    if span is not None:
        assert inline is not None
        return inline.decode(span)
    match = HEADER_RE.match(value)
    if not match:
        raise ValueError(FORM_ERROR)
    if len(value) - match.end() <= STEP:
        try:
            return base64.b64decode(value[match.end() :], validate=True)
        except (binascii.Error, ValueError):
            raise ValueError(BASE64_ERROR) from None
    return _decode(value, match.end(), len(value), escaped=False)


def find(buffer: Buffer, sub: bytes, start: int, end: int) -> int:
    """``buffer.find(sub, start, end)`` in ``STEP`` windows, each a short call."""
    pos = start
    while pos < end:
        stop = min(pos + STEP + len(sub) - 1, end)
        found = buffer.find(sub, pos, stop)
        if found >= 0:
            return found
        pos += STEP
    return -1


def _pieces(source: str | Buffer, start: int, end: int, *, escaped: bool) -> Iterator[bytes]:
    """``source[start:end]`` as ASCII bytes in pieces of about ``STEP``; with ``escaped``,
    ``\\/`` is unescaped and never split between two pieces. Non-ASCII text raises
    UnicodeEncodeError."""
    pos = start
    while pos < end:
        if pos > start:
            yield_interpreter()
        stop = min(pos + STEP, end)
        if escaped and stop < end and source[stop - 1] == 0x5C:
            stop += 1
        chunk = source[pos:stop]
        piece = chunk.encode("ascii") if isinstance(chunk, str) else bytes(chunk)
        if escaped and b"\\" in piece:
            piece = piece.replace(_ESCAPED_SLASH, b"/")
        yield piece
        pos = stop


def yield_interpreter() -> None:
    """Let a thread waiting for the interpreter lock (the event loop's) take it now.

    Between two steps of long work in a thread; otherwise the loop waits for the lock's
    switch interval (5 ms) each time it wakes, several times per request it answers.
    """
    time.sleep(0)


def _decode(source: str | Buffer, start: int, end: int, *, escaped: bool) -> memoryview:
    """Strict base64 of ``source[start:end]``, as ``base64.b64decode(validate=True)`` would
    decode it, in ``STEP`` pieces, filled in place (no final copy).

    The result lives in an anonymous memory map: its pages are zero when first touched, so
    unlike ``bytearray(n)`` nothing zero-fills tens of megabytes in one call up front.
    """
    # Padding may only end the payload: an "=" before its last two characters is invalid.
    if end - start > 2 and _find_any(source, "=", start, end - 2) >= 0:
        raise ValueError(BASE64_ERROR)
    out = mmap.mmap(-1, max(1, (end - start) // 4 * 3))
    size = 0
    carry = b""
    try:
        for piece in _pieces(source, start, end, escaped=escaped):
            piece = carry + piece if carry else piece
            # Whole 4-character groups only, but for the last piece, which holds any padding.
            whole = len(piece) // 4 * 4
            piece, carry = piece[:whole], piece[whole:]
            # Without padding, the C decoder's strict mode checks the alphabet as the regular
            # expression of ``b64decode(validate=True)`` would, several times faster.
            if b"=" in piece:
                decoded = base64.b64decode(piece, validate=True)
            else:
                decoded = binascii.a2b_base64(piece, strict_mode=True)
            out[size : size + len(decoded)] = decoded
            size += len(decoded)
        if carry:  # not a whole number of 4-character groups: padding is missing
            raise ValueError(BASE64_ERROR)
    except (binascii.Error, ValueError):
        raise ValueError(BASE64_ERROR) from None
    return memoryview(out)[:size]


def _find_any(source: str | Buffer, char: str, start: int, end: int) -> int:
    if isinstance(source, str):
        pos = start
        while pos < end:
            found = source.find(char, pos, min(pos + STEP, end))
            if found >= 0:
                return found
            pos += STEP
        return -1
    return find(source, char.encode("ascii"), start, end)
