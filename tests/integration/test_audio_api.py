"""The audio models through the real app, worker, billing and outbox, on SQLite and
PostgreSQL: strict validation, ``stt_result`` in the result and the callback payload, the
``audio.task.terminal`` event, URL inputs under the address policy, and hostile input."""

from __future__ import annotations

import base64
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import web
from sqlalchemy import select

from genhook.config import Settings
from genhook.db import Task, UsageLine, WebhookDelivery
from genhook.engines.audio._tts import TextToSpeechEngine
from genhook.engines.base import EngineJob
from genhook.errors import ErrorCode
from tests.conftest import Harness
from tests.support.images import data_url as image_data_url
from tests.support.speech import word_error_rate

TTS = "genhook/text-to-speech"
STT = "genhook/speech-to-text"
SENTENCE = "We will meet at the library on Monday morning."
HOOK = "https://127.0.0.1:9/hook"  # enqueued only: no dispatcher runs in the harness


@pytest.fixture(scope="module")
def speech() -> bytes:
    engine = TextToSpeechEngine(Settings(workers=1))
    engine.load()
    params = {"prompt": SENTENCE, "output_format": "mp3", "sample_rate": 24000}
    return engine.run(EngineJob("t", TTS, params, [])).outputs[0].data


def audio_url(data: bytes, mime: str = "audio/mpeg") -> str:
    return f"data:{mime};base64," + base64.b64encode(data).decode()


def fields(response: Any) -> dict[str, str]:
    data = response.json()
    assert data["code"] == response.status_code == 400, response.text
    return {e["field"]: e["message"] for e in data["errors"]}


async def submitted(h: Harness, body: dict[str, Any]) -> str:
    response = await h.submit(body, "generateAudio")
    assert response.status_code == 200, response.text
    task_id: str = response.json()["id"]
    return task_id


async def delivery(h: Harness, task_id: str) -> WebhookDelivery:
    async with h.state.db.read() as session:
        row = await session.scalar(
            select(WebhookDelivery).where(WebhookDelivery.task_id == task_id)
        )
    assert row is not None
    return row


async def test_text_to_speech_task(harness: Harness) -> None:
    text = "Hello from genhook. " * 60  # 1,200 characters: two started thousands
    task_id = await submitted(
        harness,
        {
            "model": TTS,
            "prompt": text,
            "output_format": "ogg",
            "voice": "en-us",
            "webhook_url": HOOK,
        },
    )
    assert await harness.run_all() == 1
    result = await harness.result(task_id)
    assert result["status"] == "completed", result
    assert result["info"]["voice"] == "en-us" and result["info"]["characters"] == len(text)
    assert result["info"]["engine"] == "espeak"
    assert result["info"]["duration_seconds"] > 30
    assert "stt_result" not in result
    output = await harness.client.get(result["outputs"][0].replace("http://testserver", ""))
    assert output.status_code == 200
    assert output.headers["content-type"] == "audio/ogg"
    assert output.content[:4] == b"OggS" and b"OpusHead" in output.content[:100]
    async with harness.state.db.read() as session:
        usage = await session.scalar(select(UsageLine).where(UsageLine.task_id == task_id))
    assert usage is not None and usage.amount_micros == 30_000
    assert usage.lines == [[f"{len(text)} characters (2 started 1,000)", "0.030"]]
    row = await delivery(harness, task_id)
    assert row.event_type == "audio.task.terminal"
    sent = json.loads(row.body)
    assert sent["event_type"] == "audio.task.terminal" and sent["status"] == "OK"


async def test_the_piper_voice_speaks_english_by_default(harness: Harness) -> None:
    """The default voice, through the API, is heard back by the speech-to-text model."""
    text = "Dr. Smith paid 42 dollars for the tickets, didn't she? Yes, on Friday."
    tts_id = await submitted(
        harness, {"model": TTS, "prompt": text, "output_format": "flac", "speed": 1.2}
    )
    assert await harness.run_all() == 1
    spoken = await harness.result(tts_id)
    assert spoken["status"] == "completed", spoken
    info = spoken["info"]
    assert (info["voice"], info["engine"], info["language"]) == ("joe", "piper", "en-us")
    output = await harness.client.get(spoken["outputs"][0].replace("http://testserver", ""))
    assert output.headers["content-type"] == "audio/flac" and output.content[:4] == b"fLaC"
    stt_id = await submitted(
        harness, {"model": STT, "audio": audio_url(output.content, "audio/flac")}
    )
    assert await harness.run_all() == 1
    heard = await harness.result(stt_id)
    assert heard["status"] == "completed", heard
    assert word_error_rate(text, heard["stt_result"]["text"]) <= 0.25, heard["stt_result"]


async def test_the_catalogue_lists_each_voice_with_engine_and_language(
    harness: Harness,
) -> None:
    response = await harness.client.get(f"/api/v1/models/{TTS}", headers=harness.headers)
    assert response.status_code == 200, response.text
    voices = {v["voice"]: v for v in response.json()["choices"]["voices"]}
    assert voices["joe"] == {"voice": "joe", "engine": "piper", "language": "en-us"}
    assert voices["fr"] == {"voice": "fr", "engine": "espeak", "language": "fr"}
    assert voices["en-us"]["engine"] == "espeak" and len(voices) > 100
    assert response.json()["request_schema"]["properties"]["voice"]["default"] == "joe"


async def test_text_to_speech_base64_output(harness: Harness) -> None:
    task_id = await submitted(
        harness,
        {"model": TTS, "prompt": SENTENCE, "output_format": "wav", "enable_base64_output": True},
    )
    await harness.run_all()
    result = await harness.result(task_id)
    assert base64.b64decode(result["outputs"][0])[:4] == b"RIFF"


async def test_speech_to_text_task(harness: Harness, speech: bytes) -> None:
    task_id = await submitted(
        harness, {"model": STT, "audio": audio_url(speech, "audio/wav"), "webhook_url": HOOK}
    )
    async with harness.state.db.read() as session:
        task = await session.get(Task, task_id)
    assert task is not None and "audio" not in task.params  # the bytes travel as a blob
    assert task.inputs[0]["field"] == "audio" and task.inputs[0]["format"] == "mp3"
    await harness.run_all()
    result = await harness.result(task_id)
    assert result["status"] == "completed", result
    stt = result["stt_result"]
    assert word_error_rate(SENTENCE, stt["text"]) <= 0.25, stt
    # Detected (Whisper base) as English, and transcribed by tiny.en as without detection.
    assert stt["language"] == "en" and 0.5 <= stt["language_probability"] <= 1
    assert result["info"]["model"] == "tiny.en" and result["info"]["language_detected"]
    assert 2 < stt["duration"] < 5
    assert stt["segments"][0]["text"] and stt["words"][0]["word"]
    assert set(stt["words"][0]) == {"word", "start", "end", "probability"}
    json_url, srt_url = result["outputs"]
    assert json_url.endswith(".json") and srt_url.endswith(".srt")
    transcript = await harness.client.get(json_url.replace("http://testserver", ""))
    assert transcript.headers["content-type"] == "application/json"
    assert transcript.json() == stt
    captions = await harness.client.get(srt_url.replace("http://testserver", ""))
    assert captions.text.startswith("1\n00:00:00,000 --> ")
    row = await delivery(harness, task_id)
    sent = json.loads(row.body)
    assert row.event_type == sent["event_type"] == "audio.task.terminal"
    assert sent["payload"]["stt_result"] == stt
    async with harness.state.db.read() as session:
        usage = await session.scalar(select(UsageLine).where(UsageLine.task_id == task_id))
    assert usage is not None and usage.amount_micros == 6_000


@pytest.fixture
async def audio_server(speech: bytes) -> AsyncIterator[str]:
    async def ok(_: web.Request) -> web.Response:
        return web.Response(body=speech, content_type="image/png")  # the bytes decide

    async def text(_: web.Request) -> web.Response:
        return web.Response(text="<html>not audio</html>", content_type="audio/mpeg")

    app = web.Application()
    app.router.add_get("/speech", ok)
    app.router.add_get("/page", text)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    yield f"http://127.0.0.1:{port}"
    await runner.cleanup()


async def test_audio_urls_are_fetched(harness: Harness, audio_server: str) -> None:
    good = await submitted(harness, {"model": STT, "audio": f"{audio_server}/speech"})
    missing = await submitted(harness, {"model": STT, "audio": f"{audio_server}/gone"})
    page = await submitted(harness, {"model": STT, "audio": f"{audio_server}/page"})
    assert await harness.run_all() == 3
    harness.state.settings.input_max_bytes = 1000
    big = await submitted(harness, {"model": STT, "audio": f"{audio_server}/speech"})
    assert await harness.run_all() == 1
    assert (await harness.result(good))["status"] == "completed"
    result = await harness.result(missing)
    assert result["error_code"] == ErrorCode.INPUT_FETCH_FAILED
    assert result["error"].startswith("audio: ")
    assert (await harness.result(page))["error_code"] == ErrorCode.INPUT_UNSUPPORTED_FORMAT
    assert (await harness.result(big))["error_code"] == ErrorCode.INPUT_TOO_LARGE


async def test_hostile_audio_fails_cleanly_and_the_worker_goes_on(
    harness: Harness, speech: bytes
) -> None:
    silent_wav = (
        b"RIFF"
        + (36 + 32000).to_bytes(4, "little")
        + b"WAVEfmt "
        + bytes.fromhex("1000000001000100803e0000007d00000200 1000".replace(" ", ""))
        + b"data"
        + (32000).to_bytes(4, "little")
        + bytes(32000)
    )
    cases = {
        ErrorCode.INPUT_NO_SPEECH: audio_url(silent_wav, "audio/wav"),
        ErrorCode.INPUT_CORRUPT: audio_url(silent_wav[:20000], "audio/wav"),
    }
    ids = {}
    for code, url in cases.items():
        ids[code] = await submitted(harness, {"model": STT, "audio": url, "webhook_url": HOOK})
    after = await submitted(harness, {"model": STT, "audio": audio_url(speech), "language": "en"})
    assert await harness.run_all() == 3
    for code, task_id in ids.items():
        result = await harness.result(task_id)
        assert result["status"] == "failed" and result["error_code"] == code, result
        sent = json.loads((await delivery(harness, task_id)).body)
        assert sent["status"] == "ERROR" and sent["payload"]["error_code"] == code
        assert "stt_result" not in sent["payload"]
    assert (await harness.result(after))["status"] == "completed"
    async with harness.state.db.read() as session:
        billed = (await session.scalars(select(UsageLine.task_id))).all()
    assert set(billed) == {after}


@pytest.mark.parametrize(
    ("changes", "field", "reason"),
    [
        ({"speed": 3}, "speed", "at most 2"),
        ({"speed": 0.1}, "speed", "at least 0.5"),
        ({"speed": "fast"}, "speed", ""),
        ({"prompt": ""}, "prompt", "must not be empty"),
        ({"prompt": "x" * 5001}, "prompt", "at most 5000"),
        ({"prompt": "   "}, "prompt", "blank"),
        ({"voice": "klingon"}, "voice", "unknown voice"),
        ({"voice": "en+nobody"}, "voice", "unknown voice variant"),
        ({"output_format": "aiff"}, "output_format", "mp3"),
        ({"sample_rate": 11000}, "sample_rate", "one of"),
        ({"sample_rate": "24000"}, "sample_rate", ""),
        ({"output_format": "ogg", "sample_rate": 44100}, "sample_rate", "Opus"),
        ({"enable_base64_output": "yes"}, "enable_base64_output", ""),
        ({"volume": 2}, "volume", "not a known field"),
    ],
)
async def test_text_to_speech_validation(
    harness: Harness, changes: dict[str, Any], field: str, reason: str
) -> None:
    response = await harness.submit({"model": TTS, "prompt": SENTENCE, **changes}, "generateAudio")
    assert reason in fields(response)[field]


@pytest.mark.parametrize(
    ("changes", "field", "reason"),
    [
        ({"audio": None}, "audio", "is required"),
        ({"audio": 5}, "audio", ""),
        ({"audio": "ftp://example.com/a.mp3"}, "audio", "http(s) URL"),
        ({"audio": audio_url(b"not audio at all")}, "audio", "not an accepted audio"),
        ({"audio": image_data_url()}, "audio", "not an accepted audio"),
        ({"audio": "data:audio/mpeg;base64,@@@"}, "audio", "not valid base64"),
        ({"language": "english"}, "language", "unknown language 'english'"),
        ({"language": "zz"}, "language", "unknown language 'zz'"),
        ({"language": "yue"}, "language", "Whisper language code"),  # not in Whisper base
        ({"language": 7}, "language", ""),
        ({"word_timestamps": "true"}, "word_timestamps", ""),
        ({"prompt": "x" * 1001}, "prompt", "at most 1000"),
        ({"speed": 1.0}, "speed", "not a known field"),
    ],
)
async def test_speech_to_text_validation(
    harness: Harness, speech: bytes, changes: dict[str, Any], field: str, reason: str
) -> None:
    body = {"model": STT, "audio": audio_url(speech), **changes}
    response = await harness.submit(
        {k: v for k, v in body.items() if v is not None}, "generateAudio"
    )
    assert reason in fields(response)[field]


@pytest.mark.parametrize("model", [TTS, STT])
@pytest.mark.parametrize("path", ["generateImage", "generateVideo"])
async def test_audio_models_only_on_the_audio_path(harness: Harness, model: str, path: str) -> None:
    response = await harness.submit({"model": model, "prompt": SENTENCE}, path)
    assert "/api/v1/model/generateAudio" in fields(response)["model"]


async def test_image_model_refused_on_the_audio_path(harness: Harness) -> None:
    body = {"model": "genhook/image-edit", "prompt": "invert", "images": [image_data_url()]}
    response = await harness.submit(body, "generateAudio")
    assert "/api/v1/model/generateImage" in fields(response)["model"]
