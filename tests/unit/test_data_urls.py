"""Data URLs decoded in steps from a body's bytes read exactly as one whole decode would, and
the body parser leaves only input fields' data URLs in the bytes."""

from __future__ import annotations

import base64
import binascii
import json
import mmap
from typing import Any

import pytest

from genhook import data_urls
from genhook.api.bodies import BodyLimits, parse_json_body
from genhook.data_urls import BASE64_ERROR, FORM_ERROR, InlineData, decode_data_url
from genhook.errors import InvalidRequest, PayloadTooLarge
from genhook.tasks.admission import request_hash

HEADER = b"data:image/png;base64,"
PAYLOADS = [
    b"",
    b"QQ==",
    b"QUI=",
    b"QUJD",
    b"QUJDRA==",
    b"QUJDREVGR0g=",
    b"QQ",
    b"QUI",
    b"Q",
    b"QQ=",
    b"Q===",
    b"QQ==QQ==",
    b"=QUJD",
    b"QU=JD",
    b"QUJD!UJD",
    b"QUJD QUJD",
    b"QUJDQUJD\nQUJD",
    b"QUJDQUJDQUJDQUJDQUJDQUJDQUJD" * 3,
    base64.b64encode(bytes(range(256)) * 3),
    base64.b64encode(bytes(range(256))).replace(b"/", b"\\/"),
    b"QUJD\\/QUJD",
    b"QUJD\\\\/QUJD",
    b"QUJDQUJ\\",
    b"QUJD\\nQUJD",
    b"\\/\\/\\/\\/",
    b"QUJDQUJDQU==",
]


def reference(payload: bytes) -> bytes | None:
    """What the body held before: the whole string, ``\\/`` unescaped, decoded at once."""
    try:
        return base64.b64decode(payload.replace(b"\\/", b"/"), validate=True)
    except (binascii.Error, ValueError):
        return None


def inline_decode(raw: bytes) -> bytes | None:
    inline = InlineData(raw, "t-", [(0, len(raw))])
    try:
        return bytes(decode_data_url(inline.placeholder(0), inline))
    except ValueError as exc:
        assert str(exc) == BASE64_ERROR
        return None


@pytest.mark.parametrize("step", [4, 8, 12, 1024 * 1024])
@pytest.mark.parametrize("payload", PAYLOADS, ids=range(len(PAYLOADS)))
def test_stepwise_decode_matches_a_whole_decode(
    monkeypatch: pytest.MonkeyPatch, step: int, payload: bytes
) -> None:
    monkeypatch.setattr(data_urls, "STEP", step)
    expected = reference(payload)
    assert inline_decode(HEADER + payload) == expected
    if b"\\" not in payload:
        text = (HEADER + payload).decode()
        try:
            got: bytes | None = bytes(decode_data_url(text))
        except ValueError as exc:
            assert str(exc) == BASE64_ERROR
            got = None
        assert got == expected


@pytest.mark.parametrize(
    ("header", "valid"),
    [
        (b"data:image/png;base64,", True),
        (b"data:image\\/png;base64,", True),
        (b"data:;base64,", True),
        (b"data:image/png;name=a.png;base64,", True),
        (b"data:image/png;;base64,", False),
        (b"data:image/png,", False),
        (b"data:image/png;base64", False),
        (b"data:image png;base64,", False),
        (b"data:image\\npng;base64,", False),
    ],
)
def test_headers_are_read_as_before(header: bytes, valid: bool) -> None:
    raw = header + b"QUJD"
    inline = InlineData(raw, "t-", [(0, len(raw))])
    if valid:
        assert decode_data_url(inline.placeholder(0), inline) == b"ABC"
    else:
        with pytest.raises(ValueError, match="must have the form"):
            decode_data_url(inline.placeholder(0), inline)
    text = raw.decode()
    if "\\" not in text:
        if valid:
            assert decode_data_url(text) == b"ABC"
        else:
            with pytest.raises(ValueError) as info:
                decode_data_url(text)
            assert str(info.value) == FORM_ERROR


LIMITS = BodyLimits(max_bytes=64 * 1024 * 1024, max_json_bytes=4096)


def parse(body: bytes, limits: BodyLimits = LIMITS) -> tuple[Any, InlineData | None]:
    return parse_json_body(body, limits)


def test_input_data_urls_stay_in_the_bytes_and_others_are_restored() -> None:
    image = "data:image/png;base64," + base64.b64encode(b"\x89PNG" + b"x" * 9000).decode()
    body = {
        "model": "m",
        "prompt": "data:text/plain;base64,QUJD",
        "images": [image, "https://a.test/x.png"],
        "audio": image,
        "x": [image[:40]],
    }
    value, inline = parse(json.dumps(body).encode())
    assert inline is not None
    assert value["prompt"] == body["prompt"] and value["x"] == body["x"]
    assert value["images"][1] == "https://a.test/x.png"
    for placeholder in (value["images"][0], value["audio"]):
        assert len(placeholder) < 100
        assert decode_data_url(placeholder, inline) == b"\x89PNG" + b"x" * 9000
    # The idempotency digest is the one of the body as sent.
    assert request_hash("generateImage", value, inline) == request_hash("generateImage", body)


def test_data_urls_outside_input_fields_count_as_json() -> None:
    big = "data:text/plain;base64," + "QUJD" * 2000
    with pytest.raises(PayloadTooLarge, match="without its image data"):
        parse(json.dumps({"prompt": big}).encode())
    with pytest.raises(PayloadTooLarge):
        parse(json.dumps({"images": [[big]]}).encode())
    value, inline = parse(json.dumps({"images": [big]}).encode())
    assert inline is not None and decode_data_url(value["images"][0], inline)


def test_non_ascii_input_data_url_is_refused() -> None:
    raw = b'{"images": ["data:image/png;base64,QUJD\xc3\xa9"]}'
    with pytest.raises(InvalidRequest) as info:
        parse(raw)
    assert info.value.errors[0].message == "a data URL holds non-ASCII bytes"


def test_escaped_slashes_hash_as_the_unescaped_string() -> None:
    payload = base64.b64encode(bytes(range(256))).decode()
    raw = ('{"images": ["data:image\\/png;base64,' + payload.replace("/", "\\/") + '"]}').encode()
    value, inline = parse(raw)
    expected = {"images": ["data:image/png;base64," + payload]}
    assert request_hash("p", value, inline) == request_hash("p", expected)
    assert decode_data_url(value["images"][0], inline) == bytes(range(256))


def test_a_placeholder_cannot_be_spelled_by_a_client() -> None:
    value, inline = parse(b'{"images": ["data:image/png;base64,QUJD"]}')
    assert inline is not None
    assert inline.index(inline.token + "1") is None
    assert inline.index("genhook-blob-0") is None
    assert inline.index(value["images"][0]) == 0


def test_a_body_in_a_memory_map_parses_as_bytes_do() -> None:
    """Large declared bodies are read into an anonymous memory map."""
    image = "data:image/png;base64," + base64.b64encode(bytes(range(256)) * 40).decode()
    for body in (
        json.dumps({"model": "m", "prompt": "p", "images": [image]}).encode(),
        json.dumps({"model": "m", "prompt": "p" * 300}).encode(),
    ):
        buffer = mmap.mmap(-1, len(body))
        buffer[:] = body
        from_map, inline = parse(buffer)
        from_bytes, _ = parse(body)
        if inline is None:
            assert from_map == from_bytes
        else:
            assert from_map["prompt"] == "p"
            assert decode_data_url(from_map["images"][0], inline) == bytes(range(256)) * 40
