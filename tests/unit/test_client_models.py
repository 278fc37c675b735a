"""Parsing of the service's answers and of image inputs, without any network."""

from __future__ import annotations

import base64
from pathlib import Path

import pytest

from genhook.client import (
    GenhookError,
    InvalidRequest,
    LogLine,
    Prediction,
    SSEDecoder,
    TaskFailed,
    TooManyRequests,
)
from genhook.client._errors import error_from_response
from genhook.client._images import data_url, image_item, image_items
from genhook.client._models import Usage

JPEG = b"\xff\xd8\xff\xe0" + b"\x00" * 16


def test_prediction_tolerates_missing_and_mistyped_fields():
    p = Prediction.from_json(
        {
            "id": 5,
            "status": "processing",
            "outputs": "nope",
            "has_nsfw_contents": [0, 1],
            "urls": {"get": "u"},
            "error_code": True,
            "info": [],
            "created_at": 17,
        }
    )
    assert p.id == "" and p.model == "" and p.status == "processing"
    assert p.outputs == [] and p.has_nsfw_contents == [False, True]
    assert p.urls == {"get": "u"} and p.error_code is None and p.info == {}
    assert p.created_at == "17" and not p.done


@pytest.mark.parametrize(
    ("status", "done", "ok"),
    [
        ("completed", True, True),
        ("failed", True, False),
        ("timeout", True, False),
        ("created", False, False),
    ],
)
def test_prediction_states(status, done, ok):
    p = Prediction.from_json({"id": "t", "status": status, "error_code": 4002, "error": "slow"})
    assert p.done is done and p.succeeded is ok
    if status in ("failed", "timeout"):
        with pytest.raises(TaskFailed, match="4002"):
            p.raise_for_failure()
    else:
        assert p.raise_for_failure() is p


def test_error_mapping_from_bodies():
    exc = error_from_response(
        400, b'{"code": 400, "message": "bad", "errors": [{"field": "prompt"}, 3]}'
    )
    assert isinstance(exc, InvalidRequest) and exc.message == "bad"
    assert [(e.field, e.message) for e in exc.errors] == [("prompt", "")]
    exc = error_from_response(429, b"")
    assert isinstance(exc, TooManyRequests) and exc.message == "HTTP 429"
    exc = error_from_response(418, b"<h1>teapot</h1>")
    assert type(exc) is GenhookError and exc.status_code == 418 and exc.message == "<h1>teapot</h1>"


def test_usage_parsing_ignores_garbage():
    usage = Usage.from_json(
        {"total_usd": "x", "items": [{"lines": [["a", "0.1"], ["bad"]]}, "junk"]}
    )
    assert usage.total_usd == 0 and len(usage.items) == 1 and len(usage.items[0].lines) == 1


def test_image_inputs(tmp_path: Path):
    assert data_url(JPEG) == "data:image/jpeg;base64," + base64.b64encode(JPEG).decode()
    assert data_url(b"plain text").startswith("data:application/octet-stream;base64,")
    path = tmp_path / "x.png"  # the name says PNG, the bytes say JPEG: the bytes win
    path.write_bytes(JPEG)
    assert image_item(str(path)).startswith("data:image/jpeg;")
    assert image_item(bytearray(JPEG)) == image_item(memoryview(JPEG)) == image_item(JPEG)
    assert image_items(("http://a/1.png", path)) == ["http://a/1.png", image_item(path)]
    assert image_item("ftp://example.test/a.png") == "ftp://example.test/a.png"
    with pytest.raises(TypeError):
        image_item(42)  # type: ignore[arg-type]
    with pytest.raises(FileNotFoundError):
        image_item(str(tmp_path / "missing.jpg"))


def test_live_fields_and_events_parse() -> None:
    waiting = Prediction.from_json({"id": "t", "status": "created", "queue_position": 3})
    assert waiting.queue_position == 3 and waiting.progress is None and waiting.logs == []
    running = Prediction.from_json(
        {
            "id": "t",
            "status": "processing",
            "started_at": "2026-11-22T09:00:00.000Z",
            "progress": 1,
            "logs": [{"at": "2026-11-22T09:00:00.100Z", "message": "plan: blur"}, "junk"],
        }
    )
    assert running.progress == 1.0 and running.started_at == "2026-11-22T09:00:00.000Z"
    assert running.logs == [LogLine("2026-11-22T09:00:00.100Z", "plan: blur")]
    assert Prediction.from_json({"progress": "half", "queue_position": True}).progress is None

    decoder = SSEDecoder()
    lines = [": keep-alive", "", "id: processing:7", "event: processing"]
    lines += ['data: {"id": "t", "status": "processing", "progress": 0.5}', ""]
    lines += [
        "id: completed:9",
        "event: completed",
        'data: {"id": "t",',
        'data: "status": "completed"}',
    ]
    lines += ["", "data: not json", ""]
    events = [event for line in lines if (event := decoder.feed(line)) is not None]
    assert [(e.id, e.event, e.done) for e in events] == [
        ("processing:7", "processing", False),
        ("completed:9", "completed", True),
    ]
    assert events[0].prediction.progress == 0.5


def test_prediction_carries_a_typed_stt_result():
    p = Prediction.from_json(
        {
            "id": "t",
            "status": "completed",
            "stt_result": {
                "text": "Hello there.",
                "language": "en",
                "language_probability": 1,
                "duration": 1.25,
                "segments": [{"start": 0, "end": 1.2, "text": "Hello there."}, "junk"],
                "words": [
                    {"word": "Hello", "start": 0.0, "end": 0.5, "probability": 0.9},
                    {"word": "there.", "start": 0.5, "end": 1.2, "probability": True},
                ],
            },
        }
    )
    stt = p.stt_result
    assert stt is not None and stt.text == "Hello there." and stt.language == "en"
    assert stt.language_probability == 1.0 and stt.duration == 1.25
    assert [s.text for s in stt.segments] == ["Hello there."]
    assert [(w.word, w.start, w.end) for w in stt.words] == [
        ("Hello", 0.0, 0.5),
        ("there.", 0.5, 1.2),
    ]
    assert stt.words[1].probability == 0.0
    assert Prediction.from_json({"stt_result": "no"}).stt_result is None


def test_a_file_value_is_read_whatever_its_field_is_called(tmp_path: Path) -> None:
    from genhook.client._images import media_fields

    path = tmp_path / "notes.txt"
    path.write_bytes(b"hello")
    fields = media_fields(
        {"document": path, "clips": [path, b"abc"], "prompt": str(path), "count": 3}
    )
    assert fields["document"].startswith("data:") and fields["document"].endswith("aGVsbG8=")
    assert len(fields["clips"]) == 2 and all(c.startswith("data:") for c in fields["clips"])
    # A string in a field whose name says nothing of media stays a string.
    assert fields["prompt"] == str(path)
    assert fields["count"] == 3
