"""Wire schemas of the two audio models, strict like the image-edit request.

Validation failures surface as HTTP 400 naming the field, e.g. ``speed`` or ``audio``.
"""

from __future__ import annotations

import re
from typing import Literal
from urllib.parse import urlsplit

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictInt,
    StrictStr,
    ValidationInfo,
    field_validator,
)

from genhook.data_urls import InlineData, decode_data_url, inline_data, is_data_url
from genhook.engines.audio._formats import AUDIO_CONTENT_TYPES, sniff_audio_format
from genhook.engines.audio._voices import DEFAULT_VOICE, check_voice
from genhook.engines.edit_request import IMAGE_REFS, MAX_IMAGE_URL_CHARS, ImageRef

MAX_TTS_CHARS = 5_000
MAX_STT_PROMPT_CHARS = 1_000
SAMPLE_RATES: tuple[int, ...] = (8000, 16000, 22050, 24000, 32000, 44100, 48000)
OPUS_SAMPLE_RATES: tuple[int, ...] = (8000, 16000, 24000, 48000)

_LANGUAGE_RE = re.compile(r"^[a-z]{2,3}$")
# Whisper's language codes, kept here so the API process never loads the model's libraries.
WHISPER_LANGUAGES = frozenset(
    "af am ar as az ba be bg bn bo br bs ca cs cy da de el en es et eu fa fi fo fr gl gu ha "  # noqa: SIM905
    "haw he hi hr ht hu hy id is it ja jw ka kk km kn ko la lb ln lo lt lv mg mi mk ml mn mr "
    "ms mt my ne nl nn no oc pa pl ps pt ro ru sa sd si sk sl sn so sq sr su sv sw ta te tg "
    "th tk tl tr tt uk ur uz vi yi yo zh yue".split()
)
# What the shipped multilingual model (Whisper base) transcribes: all but ``yue``, which only
# large-v3 knows. ``language`` accepts these and ``auto``.
STT_LANGUAGES = WHISPER_LANGUAGES - {"yue"}


class TextToSpeechRequest(BaseModel):
    """``genhook/text-to-speech`` on ``generateAudio``."""

    model_config = ConfigDict(extra="forbid", strict=True)

    model: StrictStr
    prompt: StrictStr = Field(min_length=1, max_length=MAX_TTS_CHARS)
    voice: StrictStr = DEFAULT_VOICE
    speed: float = Field(default=1.0, ge=0.5, le=2.0)
    output_format: Literal["mp3", "wav", "ogg", "flac"] = "mp3"
    sample_rate: StrictInt = 24000
    enable_base64_output: StrictBool = False
    webhook_url: StrictStr | None = None

    @field_validator("prompt")
    @classmethod
    def _prompt(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("the text to speak is blank")
        return value

    @field_validator("voice")
    @classmethod
    def _voice(cls, value: str) -> str:
        return check_voice(value)

    @field_validator("sample_rate")
    @classmethod
    def _sample_rate(cls, value: int, info: ValidationInfo) -> int:
        if value not in SAMPLE_RATES:
            raise ValueError(f"sample_rate must be one of: {', '.join(map(str, SAMPLE_RATES))}")
        if info.data.get("output_format") == "ogg" and value not in OPUS_SAMPLE_RATES:
            raise ValueError(
                "Opus (output_format ogg) supports a sample_rate of "
                f"{', '.join(map(str, OPUS_SAMPLE_RATES))}"
            )
        return value


class SpeechToTextRequest(BaseModel):
    """``genhook/speech-to-text`` on ``generateAudio``."""

    model_config = ConfigDict(extra="forbid", strict=True)

    model: StrictStr
    audio: StrictStr
    language: StrictStr = Field(
        default="auto",
        description="auto (detect it; English goes to tiny.en, other languages to Whisper "
        "base) or a Whisper language code such as en, de, fr to skip detection.",
    )
    word_timestamps: StrictBool = True
    prompt: StrictStr | None = Field(default=None, max_length=MAX_STT_PROMPT_CHARS)
    webhook_url: StrictStr | None = None

    @field_validator("audio")
    @classmethod
    def _audio(cls, value: str, info: ValidationInfo) -> str:
        ref = parse_audio_ref(value, inline_data(info.context))
        # Hand the decoded bytes to submission, which stores them with the task row.
        if isinstance(info.context, dict):
            info.context[IMAGE_REFS] = [ref]
        return value

    @field_validator("language")
    @classmethod
    def _language(cls, value: str) -> str:
        code = value.strip().lower()
        if code == "auto":
            return code
        if not _LANGUAGE_RE.match(code) or code not in STT_LANGUAGES:
            raise ValueError(
                f"unknown language {value!r}: use auto (detect it) or a Whisper language "
                "code such as en, fr, de, es, ja"
            )
        return code


def parse_audio_ref(value: str, inline: InlineData | None = None) -> ImageRef:
    """Parse ``audio``: an http(s) URL to fetch later or a base64 data URL of audio bytes
    (or the placeholder of one left in the body's bytes, ``inline``)."""
    if is_data_url(value, inline):
        data = decode_data_url(value, inline)
        if not data:
            raise ValueError("the data URL holds no bytes")
        fmt = sniff_audio_format(data)
        if fmt is None:
            raise ValueError(
                "the data URL's bytes are not an accepted audio or video format "
                "(WAV, MP3, OGG, FLAC, M4A/MP4, AAC, WebM/Matroska)"
            )
        return ImageRef(data=data, format=fmt, content_type=AUDIO_CONTENT_TYPES[fmt], field="audio")
    if len(value) > MAX_IMAGE_URL_CHARS:
        raise ValueError(f"an audio URL may be at most {MAX_IMAGE_URL_CHARS} characters")
    try:
        parts = urlsplit(value)
        parts.port  # noqa: B018 - raises ValueError on a malformed port
    except ValueError:
        raise ValueError("not a valid URL") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError("audio must be an http(s) URL or a base64 data URL")
    return ImageRef(url=value, field="audio")
