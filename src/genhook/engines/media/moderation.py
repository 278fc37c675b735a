"""Prompt moderation: blocked terms matched as whole words, case-insensitively.

The built-in list is deliberately small and unambiguous (sexual content and abuse); it
applies unless ``GENHOOK_MODERATION_BUILTIN_TERMS=false``, and operators add their own with
``GENHOOK_MODERATION_BLOCKED_TERMS``. NSFW *images* are judged by the detector instead.
"""

from __future__ import annotations

import re

from genhook.config import Settings
from genhook.errors import ErrorCode, TaskFailure

BUILTIN_BLOCKED_TERMS: tuple[str, ...] = (
    "nude",
    "nudes",
    "naked",
    "nudity",
    "nsfw",
    "porn",
    "porno",
    "pornographic",
    "pornography",
    "undress",
    "undressed",
    "undressing",
    "topless",
    "genitals",
    "sex act",
    "explicit sex",
    "child abuse",
    "csam",
)

_NON_WORD = re.compile(r"[^0-9a-z]+")


def _normalize(text: str) -> str:
    return " " + _NON_WORD.sub(" ", text.lower()).strip() + " "


def blocked_terms(settings: Settings) -> tuple[str, ...]:
    extra = tuple(term for term in settings.moderation_blocked_terms if term.strip())
    return (BUILTIN_BLOCKED_TERMS if settings.moderation_builtin_terms else ()) + extra


def check_prompt(prompt: str, terms: tuple[str, ...]) -> None:
    """Raise ``MODERATION_PROMPT_BLOCKED`` naming the first blocked term the prompt contains.

    Both sides are reduced to lowercase words separated by single spaces, so "Sex-Act" matches
    the term "sex act", and a term never matches inside a longer word ("nude" in "denuded").
    """
    haystack = _normalize(prompt)
    for term in terms:
        needle = _normalize(term)
        if needle.strip() and needle in haystack:
            raise TaskFailure(
                ErrorCode.MODERATION_PROMPT_BLOCKED,
                f"the prompt contains the blocked term {term.strip()!r}",
            )
