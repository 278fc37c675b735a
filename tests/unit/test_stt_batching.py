"""``genhook/speech-to-text`` batched: several recordings in one pass of faster-whisper's
``BatchedInferencePipeline``, each with its own transcript and times counted from its own
start; a recording that cannot be transcribed fails alone."""

from __future__ import annotations

import io
import wave
from typing import Any

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
        params = {"prompt": text, "voice": "en-us", "output_format": "wav", "sample_rate": 16000}
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
        EngineJob(f"t{index}", STT, {"word_timestamps": True, "language": "en"}, [data])
        for index, data in enumerate(inputs)
    ]
    # The file that is not audio says no length: its key is its own.
    assert len({engine.batch_key(job) for job in jobs[:3]}) == 1
    plain = EngineJob("p", STT, {"word_timestamps": False, "language": "en"}, [recordings[1]])
    assert engine.batch_key(plain) != engine.batch_key(jobs[0])
    # Another language is another model (Whisper base): never in tiny.en's call.
    german = EngineJob("g", STT, {"word_timestamps": True, "language": "de"}, [recordings[0]])
    french = EngineJob("f", STT, {"word_timestamps": True, "language": "fr"}, [recordings[0]])
    assert len({engine.batch_key(job) for job in (jobs[0], german, french)}) == 3
    # A recording whose language is to be detected runs alone: detection picks its model.
    detected = [EngineJob(f"d{n}", STT, {}, [recordings[0]]) for n in range(2)]
    auto = EngineJob("a", STT, {"language": "auto"}, [recordings[0]])
    keys = {engine.batch_key(job) for job in (*detected, auto, jobs[0])}
    assert len(keys) == 4

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


def padded_wav(speech: bytes, seconds: float) -> bytes:
    """``speech`` (a 16 kHz mono WAV) followed by silence up to ``seconds`` in all."""
    with wave.open(io.BytesIO(speech)) as source:
        samples = np.frombuffer(source.readframes(source.getnframes()), dtype="<i2")
    padded = np.zeros(int(seconds * 16000), dtype="<i2")
    padded[: len(samples)] = samples[: len(padded)]
    buffer = io.BytesIO()
    with wave.open(buffer, "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(16000)
        out.writeframes(padded.tobytes())
    return buffer.getvalue()


def test_recordings_of_very_different_lengths_never_share_a_call(
    recordings: list[bytes],
) -> None:
    """A short recording would otherwise wait for another account's long one: the key holds
    a length bucket (up to 30 s, 60 s, 120 s, 240 s, ...) read from the file's header."""
    engine = SpeechToTextEngine(Settings(workers=1))
    engine.load()

    def key(seconds: float) -> object:
        job = EngineJob("t", STT, {"language": "en"}, [padded_wav(recordings[1], seconds)])
        return engine.batch_key(job)

    assert key(2.8) == key(12.0) == key(29.0)
    assert key(2.8) != key(45.0) == key(59.0)
    assert len({key(2.8), key(45.0), key(100.0), key(238.0)}) == 4
    # A file whose header says no length runs alone.
    assert engine.batch_key(EngineJob("a", STT, {}, [b"not audio"])) != engine.batch_key(
        EngineJob("b", STT, {}, [b"not audio"])
    )


def test_one_pass_takes_at_most_the_audio_budget_and_skips_given_up_tasks(
    recordings: list[bytes],
) -> None:
    """Four recordings of 20 s with a 45-second budget: passes of two, two; a task given up
    during the first pass is left out of the second."""
    engine = SpeechToTextEngine(Settings(workers=1, stt_max_batch_seconds=45.0))
    engine.load()
    jobs = [
        EngineJob(f"t{n}", STT, {"language": "en"}, [padded_wav(recordings[1], 20.0)])
        for n in range(4)
    ]
    assert len({engine.batch_key(job) for job in jobs}) == 1
    transcribe = engine._transcribe_many
    passes: list[float] = []

    def counted(audios: list[Any], request: Any, route: Any) -> list[dict[str, Any]]:
        passes.append(sum(audio.duration for audio in audios))
        jobs[3].stop.set()  # canceled while the first pass runs
        return transcribe(audios, request, route)

    engine._transcribe_many = counted  # type: ignore[method-assign]
    results = engine.run_batch(jobs)
    assert passes == [40.0, 20.0]
    for result in results[:3]:
        assert isinstance(result, EngineResult) and result.stt_result is not None
        assert word_error_rate(SENTENCES[4], result.stt_result["text"]) <= 0.25
    assert isinstance(results[3], TaskFailure)
