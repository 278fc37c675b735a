"""``genhook/text-to-speech``: eSpeak NG speech, encoded by PyAV."""

from __future__ import annotations

from typing import TYPE_CHECKING

from genhook.engines.audio._codec import ENCODINGS, encode
from genhook.engines.audio._espeak import Espeak
from genhook.engines.audio._requests import TextToSpeechRequest
from genhook.engines.base import EngineJob, EngineOutput, EngineResult
from genhook.errors import ErrorCode, TaskFailure

if TYPE_CHECKING:
    from genhook.config import Settings


class TextToSpeechEngine:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._espeak: Espeak | None = None

    def load(self) -> None:
        self._espeak = Espeak.get()

    def run(self, job: EngineJob) -> EngineResult:
        espeak = self._espeak or Espeak.get()
        request = job.request_as(TextToSpeechRequest)
        text = request.prompt
        voice = request.voice
        fmt = request.output_format
        rate = request.sample_rate
        try:
            samples = espeak.synthesize(text, voice, float(request.speed))
        except ValueError as exc:
            raise TaskFailure(ErrorCode.INSTRUCTION_INVALID, str(exc)) from None
        if len(samples) == 0:
            raise TaskFailure(ErrorCode.PROMPT_NOT_UNDERSTOOD, "the text holds nothing to speak")
        duration = len(samples) / espeak.sample_rate
        job.report(progress=0.7, log=f"spoke {len(text)} characters ({duration:.1f} s)")
        data = encode(samples, espeak.sample_rate, fmt, rate)
        job.report(progress=1.0, log=f"encoded {fmt}, {len(data)} bytes")
        return EngineResult(
            outputs=[EngineOutput(data=data, content_type=ENCODINGS[fmt][3])],
            info={
                "duration_seconds": round(duration, 3),
                "voice": voice,
                "sample_rate": rate,
                "output_format": fmt,
                "characters": len(text),
            },
        )
