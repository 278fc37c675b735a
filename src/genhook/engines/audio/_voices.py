"""The eSpeak NG voices the text-to-speech model accepts, read from the wheel's voice data.

Reading the data directory (not the library) keeps request validation in the API process
free of the native library.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path

DEFAULT_VOICE = "en-us"


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


def check_voice(value: str) -> str:
    """Normalise ``value`` to ``language[+variant]``; raise ValueError naming the choices."""
    language, plus, variant = value.strip().lower().partition("+")
    if language not in languages():
        raise ValueError(
            f"unknown voice {value!r}; use a language such as en-us, en, fr, de, es "
            "(see docs/engines/text-to-speech.md for the list)"
        )
    if plus and variant not in variants():
        raise ValueError(
            f"unknown voice variant {variant!r}; use one of: {', '.join(sorted(variants()))}"
        )
    return f"{language}+{variants()[variant]}" if plus else language
