"""``genhook/text-to-speech``: a Piper voice (English, by default) or eSpeak NG, encoded by PyAV."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from genhook.engines.audio._codec import ENCODINGS, encode
from genhook.engines.audio._espeak import Espeak
from genhook.engines.audio._piper import PiperVoice
from genhook.engines.audio._requests import TextToSpeechRequest
from genhook.engines.audio._voices import (
    DEFAULT_VOICE,
    PIPER_VOICES,
    voice_engine,
    voice_language,
)
from genhook.engines.base import EngineJob, EngineOutput, EngineResult
from genhook.engines.onnx import shared_threads
from genhook.errors import ErrorCode, TaskFailure

if TYPE_CHECKING:
    from genhook.config import Settings


class TextToSpeechEngine:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._espeak: Espeak | None = None

    def load(self) -> None:
        self._espeak = Espeak.get()
        self._piper(DEFAULT_VOICE)

    def _piper(self, voice: str) -> PiperVoice:
        model, config = PIPER_VOICES[voice].paths()
        return PiperVoice.get(model, config, shared_threads(self.settings))

    def speak(self, text: str, voice: str, speed: float) -> tuple[npt.NDArray[np.int16], int]:
        """Samples of ``text`` in ``voice`` and their sample rate."""
        if voice in PIPER_VOICES:
            piper = self._piper(voice)
            return piper.synthesize(text, speed), piper.sample_rate
        espeak = self._espeak or Espeak.get()
        return espeak.synthesize(text, voice, speed), espeak.sample_rate

    def run(self, job: EngineJob) -> EngineResult:
        request = job.request_as(TextToSpeechRequest)
        text = request.prompt
        voice = request.voice
        fmt = request.output_format
        rate = request.sample_rate
        try:
            samples, source_rate = self.speak(text, voice, float(request.speed))
        except ValueError as exc:
            raise TaskFailure(ErrorCode.INSTRUCTION_INVALID, str(exc)) from None
        if len(samples) == 0:
            raise TaskFailure(ErrorCode.PROMPT_NOT_UNDERSTOOD, "the text holds nothing to speak")
        duration = len(samples) / source_rate
        job.report(progress=0.7, log=f"spoke {len(text)} characters ({duration:.1f} s)")
        data = encode(samples, source_rate, fmt, rate)
        job.report(progress=1.0, log=f"encoded {fmt}, {len(data)} bytes")
        return EngineResult(
            outputs=[EngineOutput(data=data, content_type=ENCODINGS[fmt][3])],
            info={
                "duration_seconds": round(duration, 3),
                "voice": voice,
                "engine": voice_engine(voice),
                "language": voice_language(voice),
                "sample_rate": rate,
                "output_format": fmt,
                "characters": len(text),
            },
        )
