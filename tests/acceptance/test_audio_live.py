"""The audio models as a user runs them: ``genhook serve`` in a subprocess, the SDK, and
signed ``audio.task.terminal`` callbacks carrying the transcript.

On SQLite only: the same two models, their results and their callback payloads run on both
databases in tests/integration/test_audio_api.py; what this adds (the roles as processes,
the SDK, JWKS verification) does not depend on the database."""

from __future__ import annotations

import base64
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from genhook.client import Client, SttResult
from genhook.receiver import WebhookVerifier
from tests.acceptance.test_client_live import Inbox
from tests.conftest import NETGUARD, ROOT, LiveService, start_service, stop_service
from tests.support.http import HTTP
from tests.support.speech import word_error_rate

SENTENCE = "We will meet at the library on Monday morning."


@pytest.fixture
def service(tmp_path: Path) -> Iterator[LiveService]:
    # Keep an inherited PYTHONPATH (a source checkout ahead of the installed package).
    path = os.pathsep.join([str(NETGUARD), str(ROOT), os.environ.get("PYTHONPATH", "")])
    live = start_service(tmp_path, None, PYTHONPATH=path)
    yield live
    stop_service(live)


@pytest.fixture
def inbox() -> Iterator[Inbox]:
    box = Inbox()
    yield box
    box.close()


def test_speak_then_transcribe_with_signed_callbacks(service: LiveService, inbox: Inbox) -> None:
    verifier = WebhookVerifier(jwks_url=service.base_url + "/api/v1/webhooks/jwks.json")
    with Client(service.api_key, base_url=service.base_url) as client:
        spoken = client.submit(
            "genhook/text-to-speech", kind="audio", prompt=SENTENCE, webhook_url=inbox.url
        )
        done = client.wait(spoken.id, timeout=90, poll_interval=0.05).raise_for_failure()
        mp3 = HTTP.get(done.outputs[0], timeout=10)
        assert mp3.headers["content-type"] == "audio/mpeg"
        event = verifier.verify(
            dict(inbox.wait_for(spoken.id).headers), inbox.wait_for(spoken.id).body
        )
        assert event.event_type == "audio.task.terminal" and event.payload.stt_result is None

        audio = "data:audio/mpeg;base64," + base64.b64encode(mp3.content).decode()
        heard = client.submit(
            "genhook/speech-to-text", kind="audio", audio=audio, webhook_url=inbox.url
        )
        done = client.wait(heard.id, timeout=120, poll_interval=0.05).raise_for_failure()
    stt = done.stt_result
    assert isinstance(stt, SttResult)
    assert word_error_rate(SENTENCE, stt.text) <= 0.25, stt.text
    assert stt.language == "en" and stt.words and stt.words[-1].end <= stt.duration
    delivery = inbox.wait_for(heard.id)
    event = verifier.verify(dict(delivery.headers), delivery.body)
    assert event.event_type == "audio.task.terminal" and event.status == "OK"
    payload: Any = event.payload
    assert payload.stt_result == stt
    assert [url.rsplit(".", 1)[1] for url in payload.outputs] == ["json", "srt"]
