"""``genhook/speech-to-text`` batched: several recordings in one pass of faster-whisper's
``BatchedInferencePipeline``, each with its own transcript and times counted from its own
start; a recording that cannot be transcribed fails alone."""

from __future__ import annotations

import io
import wave

import numpy as np
import pytest

from genhook.config import Settings
from genhook.engines.audio._stt import SpeechToTextEngine
from genhook.engines.audio._tts import TextToSpeechEngine
from genhook.engines.base import EngineJob, EngineResult
from genhook.errors import ErrorCode, TaskFailure
from tests.support.speech import SENTENCES, word_error_rate

STT = "genhook/speech-to-text"


@pytest.fixture(scope="module")
def recordings() -> list[bytes]:
    tts = TextToSpeechEngine(Settings(workers=1))
    tts.load()
    spoken = []
    for text in (" ".join(SENTENCES[:2]), SENTENCES[4]):
        params = {"prompt": text, "output_format": "wav", "sample_rate": 16000}
        spoken.append(tts.run(EngineJob("t", "genhook/text-to-speech", params, [])).outputs[0].data)
    return spoken


def silent_wav(seconds: float = 2.0) -> bytes:
    buffer = io.BytesIO()
    with wave.open(buffer, "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(16000)
        out.writeframes(np.zeros(int(seconds * 16000), dtype="<i2").tobytes())
    return buffer.getvalue()


def test_a_batch_transcribes_each_recording_on_its_own(recordings: list[bytes]) -> None:
    engine = SpeechToTextEngine(Settings(workers=1))
    engine.load()
    inputs = [recordings[0], silent_wav(), recordings[1], b"hello, this is text"]
    jobs = [
        EngineJob(f"t{index}", STT, {"word_timestamps": True}, [data])
        for index, data in enumerate(inputs)
    ]
    assert len({engine.batch_key(job) for job in jobs}) == 1
    plain = EngineJob("p", STT, {"word_timestamps": False}, [recordings[1]])
    assert engine.batch_key(plain) != engine.batch_key(jobs[0])

    first, silent, second, not_audio = engine.run_batch(jobs)
    assert isinstance(silent, TaskFailure) and silent.code == ErrorCode.INPUT_NO_SPEECH
    assert isinstance(not_audio, TaskFailure)
    assert not_audio.code == ErrorCode.INPUT_UNSUPPORTED_FORMAT
    for result, reference in ((first, " ".join(SENTENCES[:2])), (second, SENTENCES[4])):
        assert isinstance(result, EngineResult) and result.stt_result is not None
        stt = result.stt_result
        assert word_error_rate(reference, stt["text"]) <= 0.25, stt["text"]
        # Times count from the recording's own start, inside its own duration.
        assert stt["segments"][0]["start"] < 1.0
        assert all(0 <= word["start"] <= word["end"] <= stt["duration"] for word in stt["words"])
        assert [output.content_type for output in result.outputs] == [
            "application/json",
            "application/x-subrip",
        ]
