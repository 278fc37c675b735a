"""Reading a JSON request body with bounded work and memory, 400/413 instead of crashes.

A body may be large only because of image data. Base64 data URLs are cut out of the raw
bytes with C-speed searches and replaced by placeholders; what remains (the "skeleton") is
capped at ``max_json_bytes`` and checked for nesting depth and container count before the
JSON parser sees it, so the parser's work never depends on the megabytes of image data.
The data URLs of input fields (``images`` items, ``audio``) stay in the raw bytes as
placeholders (``genhook.data_urls.InlineData``), decoded from there in short steps; any
other is restored as a string and counts against ``max_json_bytes``. Large bodies are
handled one at a time (``large_body_slot``) and parsed and validated off the event loop, so
worst-case bodies sent back to back cannot stall other requests or pile up memory.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import mmap
import re
import secrets
import traceback
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from fastapi import Request
from starlette.requests import ClientDisconnect

from genhook.data_urls import INPUT_FIELDS, STEP, Buffer, InlineData, find, yield_interpreter
from genhook.errors import FieldError, InvalidRequest, PayloadTooLarge

log = logging.getLogger(__name__)

# Bodies larger than this are parsed in a thread, one at a time (``large_body_slot``).
OFFLOAD_BYTES = 256 * 1024
LARGE_BODY_SLOTS = 1
_DATA_URL_START = b'"data:'
_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"', re.DOTALL)
_BRACKETS = re.compile(rb"[\[\]{}]")
_large_bodies: dict[int, asyncio.Semaphore] = {}


@dataclass(frozen=True, slots=True)
class BodyLimits:
    """``max_bytes`` caps the whole body (image data included); the others cap the rest."""

    max_bytes: int
    max_json_bytes: int
    max_depth: int = 32
    max_containers: int = 1000
    # False for endpoints without image data: the whole body counts as JSON structure.
    allow_data_urls: bool = True


@dataclass(frozen=True, slots=True)
class ParsedBody:
    value: Any
    # The body was large: validate it off the event loop too.
    large: bool
    # What the placeholders of input data URLs in ``value`` stand for.
    inline: InlineData | None = None


class ClientGone(Exception):
    """The client disconnected before its body was complete: a normal event, not an error."""


def _semaphore() -> asyncio.Semaphore:
    loop_id = id(asyncio.get_running_loop())
    semaphore = _large_bodies.get(loop_id)
    if semaphore is None:
        _large_bodies.clear()
        semaphore = _large_bodies[loop_id] = asyncio.Semaphore(LARGE_BODY_SLOTS)
    return semaphore


def _too_large(limit: int, what: str = "the request body") -> PayloadTooLarge:
    return PayloadTooLarge(f"{what} is larger than the {limit}-byte limit")


@contextlib.asynccontextmanager
async def large_body_slot(request: Request) -> AsyncIterator[None]:
    """Hold one of ``LARGE_BODY_SLOTS`` while a large (or unsized) body is read, parsed and
    validated: it bounds the memory bodies can take at once. A slow sender holds its slot
    for at most the body read timeout; a proxy that buffers request bodies takes that away."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) <= OFFLOAD_BYTES:
        yield
        return
    async with _semaphore():
        try:
            yield
        except Exception as exc:
            # A refused body's megabytes are locals of the frames in the error's traceback,
            # which lives on while the error is answered: free them before the next body.
            traceback.clear_frames(exc.__traceback__)
            raise


async def read_json_body(request: Request, limits: BodyLimits) -> ParsedBody:
    cap = limits.max_bytes if limits.allow_data_urls else limits.max_json_bytes
    declared = request.headers.get("content-length")
    declared_size = int(declared) if declared is not None and declared.isdigit() else None
    if declared_size is not None and declared_size > cap:
        raise _too_large(cap)
    content_type = request.headers.get("content-type", "application/json")
    if "json" not in content_type.split(";")[0].lower():
        raise InvalidRequest(
            "Content-Type must be application/json",
            [FieldError("body", f"unsupported Content-Type {content_type!r}")],
        )
    # A large declared body goes into an anonymous memory map of its size: its pages are
    # zero when first touched (nothing is filled up front for a body that may be refused
    # early) and it never moves, where a growing bytearray is copied whole each time realloc
    # cannot extend it in place (tens of milliseconds on the loop at tens of MB). A body of
    # unknown size grows a bytearray up to the cap.
    buffer: bytearray | mmap.mmap
    if declared_size is not None and declared_size > OFFLOAD_BYTES:
        buffer = mmap.mmap(-1, declared_size)
    else:
        buffer = bytearray()
    size = 0
    # Until a data URL starts, every byte counts against ``max_json_bytes``: a body of
    # structure alone is refused once past it, without reading the rest.
    seen_data_url = not limits.allow_data_urls
    try:
        async for chunk in request.stream():
            end = size + len(chunk)
            if end > cap:
                raise _too_large(cap)
            if isinstance(buffer, mmap.mmap):
                if end > len(buffer):
                    raise _too_large(len(buffer), "the request body past its Content-Length")
                buffer[size:end] = chunk
            else:
                buffer += chunk
            size = end
            if not seen_data_url:
                if buffer.find(_DATA_URL_START, max(0, size - len(chunk) - 8), size) >= 0:
                    seen_data_url = True
                elif size > limits.max_json_bytes:
                    raise _too_large(limits.max_json_bytes)
    except ClientDisconnect:
        raise ClientGone() from None
    if not size:
        raise InvalidRequest(
            "the request body is empty; send a JSON object",
            [FieldError("body", "a JSON object is required")],
        )
    raw: Buffer = buffer if size == len(buffer) else buffer[:size]
    large = len(raw) > OFFLOAD_BYTES
    if large:
        value, inline = await asyncio.to_thread(parse_json_body, raw, limits)
    else:
        value, inline = parse_json_body(raw, limits)
    return ParsedBody(value, large, inline)


def parse_json_body(raw: Buffer, limits: BodyLimits) -> tuple[Any, InlineData | None]:
    """Parse ``raw`` under ``limits``: the value, and what its input data URL placeholders
    stand for; raises ``InvalidRequest`` or ``PayloadTooLarge``."""
    token = "genhook-blob-" + secrets.token_hex(8) + "-"
    skeleton, spans = (
        _cut_data_urls(raw, token.encode("ascii")) if limits.allow_data_urls else (raw, [])
    )
    if len(skeleton) > limits.max_json_bytes:
        what = "the request body without its image data" if spans else "the request body"
        raise _too_large(limits.max_json_bytes, what)
    if isinstance(skeleton, mmap.mmap):  # the whole body, and small enough to copy
        skeleton = skeleton[:]
    _check_structure(skeleton, limits)
    try:
        value = json.loads(skeleton, parse_constant=_no_constant)
        _check_strings(value)
    except UnicodeError:
        raise _invalid("not UTF-8, or a string holds a lone surrogate") from None
    except json.JSONDecodeError as exc:
        raise _invalid(f"line {exc.lineno} column {exc.colno}: {exc.msg}") from None
    except RecursionError:
        raise _invalid("nested too deeply") from None
    except ValueError as exc:  # e.g. an integer literal over the interpreter's digit limit
        raise _invalid(str(exc)[:200]) from None
    if not spans:
        return value, None
    inline = InlineData(raw, token, spans)
    kept = _input_placeholders(value, inline)
    rest = sum(end - start for index, (start, end) in enumerate(spans) if index not in kept)
    if len(skeleton) + rest > limits.max_json_bytes:
        raise _too_large(limits.max_json_bytes, "the request body without its image data")
    for index in kept:
        _check_ascii(raw, *spans[index])
    inline.kept = kept
    return _restore(value, token, raw, spans, kept), inline if kept else None


def _input_placeholders(value: Any, inline: InlineData) -> set[int]:
    """The spans whose placeholders are input fields' values: they stay in the raw bytes."""
    kept: set[int] = set()
    if not isinstance(value, dict):
        return kept
    for field in INPUT_FIELDS:
        item = value.get(field)
        for candidate in item if isinstance(item, list) else [item]:
            if isinstance(candidate, str) and (index := inline.index(candidate)) is not None:
                kept.add(index)
    return kept


def _check_ascii(raw: Buffer, start: int, end: int) -> None:
    for pos in range(start, end, STEP):
        if pos > start:
            yield_interpreter()
        if not raw[pos : min(pos + STEP, end)].isascii():
            raise _invalid("a data URL holds non-ASCII bytes")


def _check_strings(value: Any) -> None:
    """Lone surrogates and NUL cannot be stored (PostgreSQL) or echoed back: refuse them."""
    if isinstance(value, str):
        value.encode("utf-8")
        if "\x00" in value:
            raise _invalid("a string holds a NUL character")
    elif isinstance(value, list):
        for item in value:
            _check_strings(item)
    elif isinstance(value, dict):
        for key, item in value.items():
            _check_strings(key)
            _check_strings(item)


def _invalid(detail: str) -> InvalidRequest:
    return InvalidRequest("the request body is not valid JSON", [FieldError("body", detail)])


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON value")


def _cut_data_urls(raw: Buffer, token: bytes) -> tuple[Buffer, list[tuple[int, int]]]:
    """The body with every ``"data:..."`` string replaced by a numbered placeholder string.

    Only ``bytes.find`` touches the whole body. A cut that was not really a string (a quote
    inside another string) leaves the skeleton unparseable, so nothing is misread; the cut
    contents are checked as base64 when the images are validated.
    """
    parts: list[bytes | bytearray] = []
    spans: list[tuple[int, int]] = []
    pos = 0
    while True:
        start = raw.find(_DATA_URL_START, pos)
        if start < 0:
            break
        end = find(raw, b'"', start + 1, len(raw))
        if end < 0:
            break
        parts.append(raw[pos:start])
        parts.append(b'"' + token + str(len(spans)).encode("ascii") + b'"')
        spans.append((start + 1, end))
        pos = end + 1
    if not spans:
        return raw, spans
    parts.append(raw[pos:])
    return b"".join(parts), spans


def _check_structure(skeleton: bytes | bytearray, limits: BodyLimits) -> None:
    bare = _STRING.sub(b'""', skeleton) if b'"' in skeleton else skeleton
    brackets = _BRACKETS.findall(bare)
    if len(brackets) > 2 * limits.max_containers:
        raise _invalid(f"more than {limits.max_containers} arrays and objects")
    depth = 0
    for bracket in brackets:
        if bracket in (b"[", b"{"):
            depth += 1
            if depth > limits.max_depth:
                raise _invalid(f"nested deeper than {limits.max_depth} levels")
        else:
            depth -= 1


def _restore(
    value: Any, token: str, raw: Buffer, spans: list[tuple[int, int]], kept: set[int]
) -> Any:
    if isinstance(value, str):
        if value.startswith(token):
            index = value[len(token) :]
            if index.isdigit() and int(index) < len(spans) and int(index) not in kept:
                start, end = spans[int(index)]
                try:
                    if raw.find(b"\\/", start, end) >= 0:
                        return raw[start:end].replace(b"\\/", b"/").decode("ascii")
                    # Decoded in place: no copy of megabytes of image data.
                    return str(memoryview(raw)[start:end], "ascii")
                except UnicodeDecodeError:
                    raise _invalid("a data URL holds non-ASCII bytes") from None
        return value
    if isinstance(value, list):
        return [_restore(item, token, raw, spans, kept) for item in value]
    if isinstance(value, dict):
        return {key: _restore(item, token, raw, spans, kept) for key, item in value.items()}
    return value
