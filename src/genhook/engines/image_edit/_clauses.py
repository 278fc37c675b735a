"""Cutting a prompt into clauses, with quoted text set aside and image references resolved.

Quoted text becomes a ``⟦n⟧`` placeholder so its commas and "and"s never split anything;
"black and white", "image 1 and image 2" and the like are protected the same way.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from PIL import ImageColor

from genhook.engines.image_edit._words import COLOR_PREFIX_RE, COLOR_RE
from genhook.errors import ErrorCode, TaskFailure

_ORDINALS = {
    "first": 1,
    "second": 2,
    "third": 3,
    "fourth": 4,
    "fifth": 5,
    "sixth": 6,
    "seventh": 7,
    "eighth": 8,
    "ninth": 9,
    "tenth": 10,
}
_IMAGE_WORD = r"(?:image|picture|photo|pic|img|input)"
_REF_RE = re.compile(
    rf"\b{_IMAGE_WORD}s?\s*(?:no\.?\s*|number\s*|#)?(\d+)\b"
    rf"|\b(?:the\s+)?({'|'.join(_ORDINALS)}|last|other)\s+(?:one|{_IMAGE_WORD}s?)\b"
    rf"|\b(?:the\s+)?({'|'.join(_ORDINALS)})(?=\s+_and_\s+(?:the\s+)?(?:{'|'.join(_ORDINALS)}|last)"
    rf"\s+{_IMAGE_WORD}s?\b)"
)
# "images 1 and 2" / "image 1, 2 and 3": the bare numbers after the first reference.
_REF_LIST_RE = re.compile(rf"\b{_IMAGE_WORD}s\s+(\d+(?:\s*(?:,|and|_and_|&)\s*\d+)+)\b")

_QUOTE_RE = re.compile(
    r"\"([^\"]*)\"|“([^”]*)”|«([^»]*)»|‘([^’]*)’|(?<![A-Za-z])'([^']+)'(?![A-Za-z])"
)
PLACEHOLDER_RE = re.compile(r"⟦(\d+)⟧")

# Caption text written without quotes: "add the text Hello World at the bottom", "write
# Hello World", "put the words Big Sale on top". The text runs up to a position, a color,
# a size, "and", or the end of the clause; "add" and "put" need a noun ("text", "words"),
# so "add a red border" stays a border.
_CAPTION_END = (
    r"(?=\s+(?:at|on|in|along|across|near|to)\s+(?:the\s+)?(?:very\s+)?(?:top|bottom|upper|"
    r"lower|middle|cent(?:er|re)|left|right|corner|header|footer)\b"
    rf"|\s+(?:in|with)\s+(?:a\s+)?(?:colou?r\s+)?(?:{COLOR_RE.pattern}|small|large|big|tiny|huge|"
    r"medium)|\s+(?:and|then)\s|\s*[,;.!?\n]|\s*$)"
)
_BARE_CAPTION_RE = re.compile(
    r"\b(?:(?:add|put|place|insert|type|print)\s+(?:(?:the|a|an)\s+)?(?:text|words?|caption|"
    r"title|label|message|heading|headline|slogan)|write(?:\s+(?:the|a)\s+(?:text|words?|"
    r"caption|title|label|message))?)\s*:?\s+"
    r"(?!(?:at|on|in|to|the\s+(?:top|bottom))\s)(?=[^\s⟦])([^,;.!?\n⟦]+?)" + _CAPTION_END,
    re.IGNORECASE,
)

# Phrases whose "and" must not split a clause.
_PROTECT = (
    (
        re.compile(
            rf"(\b{_IMAGE_WORD}s?\s*#?\d+|\b{_IMAGE_WORD}s\s+\d+(?:\s*,\s*\d+)*)\s*,\s*"
            rf"(?=(?:and\s+)?(?:the\s+)?(?:{_IMAGE_WORD}s?\s*#?)?\d+\b)"
        ),
        r"\1 _and_ ",
    ),
    (re.compile(r"\bblack\s+and\s+white\b"), "black _and_ white"),
    (re.compile(r"\bleft\s+and\s+right\b"), "left _and_ right"),
    (re.compile(r"\btop\s+and\s+bottom\b"), "top _and_ bottom"),
    (re.compile(r"\bbefore\s+and\s+after\b"), "before _and_ after"),
    (
        re.compile(
            rf"(\b(?:{_IMAGE_WORD}s?\s*#?\d+|\d+|(?:the\s+)?(?:{'|'.join(_ORDINALS)})"
            rf"(?:\s+{_IMAGE_WORD})?))\s+and\s+(?=(?:the\s+)?(?:{_IMAGE_WORD}s?\s*#?\d+|\d+\b|"
            rf"(?:{'|'.join(_ORDINALS)}|last)\b))"
        ),
        r"\1 _and_ ",
    ),
)
_SPLIT_RE = re.compile(
    r"\s*(?:[;,\n!]|\.(?=\s|$)|\b(?:and\s+then|and\s+also|after\s+that|afterwards|then|also|"
    r"finally|plus|and)\b)\s*"
)


def _extract_quotes(prompt: str) -> tuple[str, list[str]]:
    quotes: list[str] = []

    def repl(match: re.Match[str]) -> str:
        quotes.append(next(g for g in match.groups() if g is not None))
        return f" ⟦{len(quotes) - 1}⟧ "

    text = _QUOTE_RE.sub(repl, prompt)

    def bare(match: re.Match[str]) -> str:
        quotes.append(match.group(1).strip())
        head = match.group(0)[: match.start(1) - match.start(0)]
        return f"{head} ⟦{len(quotes) - 1}⟧ "

    return _BARE_CAPTION_RE.sub(bare, text), quotes


def _resolve_refs(text: str, image_count: int, clause: str) -> tuple[str, list[int]]:
    refs: list[int] = []

    def add(number: int) -> None:
        if not 1 <= number <= image_count:
            raise TaskFailure(
                ErrorCode.INSTRUCTION_INVALID,
                f"{clause!r} names image {number}, but the task has {image_count} image"
                f"{'s' if image_count != 1 else ''}",
            )
        if number - 1 not in refs:
            refs.append(number - 1)

    def list_repl(match: re.Match[str]) -> str:
        for number in re.findall(r"\d+", match.group(1)):
            add(int(number))
        return " " * len(match.group(0))

    text = _REF_LIST_RE.sub(list_repl, text)

    def repl(match: re.Match[str]) -> str:
        if match.group(1):
            add(int(match.group(1)))
        else:
            word = match.group(2) or match.group(3)
            if word == "last":
                add(image_count)
            elif word == "other":
                add(2 if refs == [0] or not refs else 1)
            else:
                add(_ORDINALS[word])
        return " " * len(match.group(0))

    text = _REF_RE.sub(repl, text)

    # "image 1 _and_ 2": bare numbers joined to a reference.
    def bare(match: re.Match[str]) -> str:
        add(int(match.group(1)))
        return " " * len(match.group(0))

    if refs:
        text = re.sub(r"(?<=_and_)\s+(\d+)\b", bare, text)
    return text, refs


def refs_in(text: str, image_count: int) -> list[int]:
    """The 0-based images ``text`` names, in order (references already checked)."""
    return _resolve_refs(text.lower(), image_count, text)[1]


@dataclass(frozen=True, slots=True)
class RawClause:
    body: str  # lowercased; quotes are placeholders; image references blanked out
    original: str  # the words as the user wrote them, for messages and ``info``
    refs: list[int]  # 0-based image indexes the clause names, in order


def split_prompt(prompt: str, image_count: int) -> tuple[list[RawClause], list[str]]:
    """Return the prompt's clauses in order and the quoted texts they refer to."""
    text, quotes = _extract_quotes(prompt)
    text = text.lower()
    text = COLOR_PREFIX_RE.sub(
        lambda m: (
            m.group(1) + m.group(2)
            if (m.group(1) + m.group(2)) in ImageColor.colormap
            else m.group(0)
        ),
        text,
    )
    for pattern, replacement in _PROTECT:
        text = pattern.sub(replacement, text)
    clauses: list[RawClause] = []
    for raw in _SPLIT_RE.split(text):
        raw = raw.strip()
        if not raw:
            continue
        original = PLACEHOLDER_RE.sub(lambda m: f'"{quotes[int(m.group(1))]}"', raw)
        original = re.sub(r"\s{2,}", " ", original.replace("_and_", "and"))
        body, refs = _resolve_refs(raw, image_count, original)
        clauses.append(RawClause(body, original, refs))
    return clauses, quotes
