"""Reading motion from a prompt: camera moves, fades and slideshow transitions.

Motion phrases are taken out of the prompt; what is left is read by the edit engine's
parser as looks. The plan is plain JSON under ``info.plan`` so users see how they were read.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

Transition = str  # "cut", "crossfade", "slide" or "wipe"

DEFAULT_ROTATION_DEGREES = 12.0
MAX_ROTATION_DEGREES = 360.0

_NUMBER = r"(\d{1,3}(?:\.\d+)?)"
_ZOOM_IN = re.compile(
    r"\b(?:slow(?:ly)?\s+)?(?:zoom(?:s|ing|ed)?\s+in(?:to|wards?)?|push(?:es|ing)?\s+in|"
    r"dolly\s+in|ken\s+burns(?:\s+effect)?|move\s+closer)\b",
    re.IGNORECASE,
)
_ZOOM_OUT = re.compile(
    r"\b(?:slow(?:ly)?\s+)?(?:zoom(?:s|ing|ed)?\s+out|pull(?:s|ing)?\s+(?:back|out)|"
    r"dolly\s+out|move\s+away)\b",
    re.IGNORECASE,
)
_PAN = re.compile(
    r"\b(?:pan(?:s|ning|ned)?|tilt(?:s|ing|ed)?|track(?:s|ing)?|move(?:s)?\s+the\s+camera)"
    r"\s+(?:to\s+the\s+|towards?\s+the\s+)?(left|right|up|down)(?:wards?)?\b",
    re.IGNORECASE,
)
_ROTATE = re.compile(
    r"\b(?:rotat(?:e|es|ing|ion)|spin(?:s|ning)?)\b"
    rf"(?:\s+(?:it|the\s+(?:image|picture|photo|camera)))?(?:\s+(?:by\s+)?{_NUMBER}\s*"
    r"(?:°|deg(?:ree)?s?\b))?"
    r"(?:\s+(counter[- ]?clockwise|anti[- ]?clockwise|clockwise|left|right))?",
    re.IGNORECASE,
)
_SHAKE = re.compile(
    r"\b(?:camera\s+)?(?:shak(?:e|es|ing|y)|hand[- ]?held|jitter(?:y)?|earthquake)"
    r"(?:\s+camera)?\b",
    re.IGNORECASE,
)
_FADE_BOTH = re.compile(r"\bfade(?:s|d)?\s+in\s+(?:and|&|/)\s+(?:fade\s+)?out\b", re.IGNORECASE)
_FADE_IN = re.compile(r"\bfade(?:s|d)?\s+(?:in|from\s+black)\b", re.IGNORECASE)
_FADE_OUT = re.compile(r"\bfade(?:s|d)?\s+(?:out|to\s+black)\b", re.IGNORECASE)
_TRANSITIONS: tuple[tuple[str, re.Pattern[str]], ...] = (
    (
        "crossfade",
        re.compile(
            r"\b(?:cross[- ]?fad(?:e|es|ing)|cross[- ]?dissolves?|dissolv(?:e|es|ing))"
            r"(?:\s+transitions?)?\b",
            re.IGNORECASE,
        ),
    ),
    (
        "slide",
        re.compile(r"\b(?:slid(?:e|es|ing))(?:\s+transitions?)?\b", re.IGNORECASE),
    ),
    ("wipe", re.compile(r"\b(?:wipe[sd]?|wiping)(?:\s+transitions?)?\b", re.IGNORECASE)),
    (
        "cut",
        re.compile(
            r"\b(?:(?:hard|jump|straight|quick|plain)\s+cuts?|cuts?\s+between|"
            r"cut\s+transitions?|no\s+transitions?)\b",
            re.IGNORECASE,
        ),
    ),
)
_SLIDESHOW = re.compile(r"\b(?:as\s+an?\s+)?slide\s*shows?\b", re.IGNORECASE)
# Words about making a video at all; they name no motion and no look.
_FILLER = re.compile(
    r"\b(?:animate(?:d)?|animation|video|clip|movie|motion|cinematic|"
    r"(?:very\s+)?(?:slow(?:ly)?|gentl[ey]|smooth(?:ly)?)|with\s+transitions?|transitions?)\b",
    re.IGNORECASE,
)
_CONNECTORS = re.compile(
    r"^(?:(?:and|then|with|a|an|the|it|as|also)\b\s*)+|(?:\s*\b(?:and|then|with|a|an|the))+$",
    re.IGNORECASE,
)


@dataclass(frozen=True, slots=True)
class Move:
    """One motion instruction, as shown under ``info.plan``."""

    op: str
    params: dict[str, Any] = field(default_factory=dict)
    clause: str = ""

    def describe(self) -> dict[str, Any]:
        out: dict[str, Any] = {"op": self.op, **self.params}
        if self.clause:
            out["from"] = self.clause
        return out


@dataclass(slots=True)
class MotionPlan:
    zoom: str | None = None  # "in" or "out"
    pan_x: int = 0  # -1 left, +1 right (the way the camera moves)
    pan_y: int = 0  # -1 up, +1 down
    rotate_degrees: float = 0.0  # clockwise when positive
    shake: bool = False
    fade_in: bool = False
    fade_out: bool = False
    transition: Transition | None = None
    moves: list[Move] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    rest: str = ""  # the prompt without its motion phrases, for the edit parser
    default_motion: bool = False

    @property
    def camera_moves(self) -> bool:
        return bool(self.zoom or self.pan_x or self.pan_y or self.rotate_degrees or self.shake)


def parse_motion(prompt: str) -> MotionPlan:
    """Take the motion phrases out of ``prompt``; never fails (no motion is a default)."""
    plan = MotionPlan()
    found: list[tuple[int, Move]] = []
    text = prompt

    def take(pattern: re.Pattern[str], handle: Any) -> None:
        nonlocal text
        for match in pattern.finditer(text):
            move = handle(match)
            # The same move said twice ("handheld, shaky") is one move.
            if move is not None and all(
                (move.op, move.params) != (seen.op, seen.params) for _, seen in found
            ):
                found.append((match.start(), move))
        text = pattern.sub(",", text)

    def zoom(direction: str) -> Any:
        def handle(match: re.Match[str]) -> Move:
            if plan.zoom is not None and plan.zoom != direction:
                plan.notes.append(
                    f"zoom {plan.zoom} and zoom {direction} were both asked for; "
                    f"the later one, zoom {direction}, is used"
                )
            plan.zoom = direction
            return Move(f"zoom_{direction}", {}, match.group(0).strip())

        return handle

    def pan(match: re.Match[str]) -> Move:
        direction = match.group(1).lower()
        if direction in ("left", "right"):
            plan.pan_x = -1 if direction == "left" else 1
        else:
            plan.pan_y = -1 if direction == "up" else 1
        return Move("pan", {"direction": direction}, match.group(0).strip())

    def rotate(match: re.Match[str]) -> Move:
        degrees = float(match.group(1)) if match.group(1) else DEFAULT_ROTATION_DEGREES
        if degrees > MAX_ROTATION_DEGREES:
            plan.notes.append(f"a rotation of {degrees:g} degrees was capped at 360")
            degrees = MAX_ROTATION_DEGREES
        sense = (match.group(2) or "clockwise").lower().replace(" ", "-")
        counter = sense.startswith(("counter", "anti")) or sense == "left"
        plan.rotate_degrees = -degrees if counter else degrees
        params = {
            "degrees": degrees,
            "direction": "counterclockwise" if counter else "clockwise",
        }
        return Move("rotate", params, match.group(0).strip())

    def shake(match: re.Match[str]) -> Move:
        plan.shake = True
        return Move("shake", {}, match.group(0).strip())

    def fade(which: str) -> Any:
        def handle(match: re.Match[str]) -> Move:
            if which in ("in", "both"):
                plan.fade_in = True
            if which in ("out", "both"):
                plan.fade_out = True
            op = "fade_in_out" if which == "both" else f"fade_{which}"
            return Move(op, {}, match.group(0).strip())

        return handle

    def transition(name: str) -> Any:
        def handle(match: re.Match[str]) -> Move:
            plan.transition = name
            return Move("transition", {"style": name}, match.group(0).strip())

        return handle

    take(_ZOOM_IN, zoom("in"))
    take(_ZOOM_OUT, zoom("out"))
    take(_PAN, pan)
    take(_ROTATE, rotate)
    take(_SHAKE, shake)
    take(_FADE_BOTH, fade("both"))
    take(_FADE_IN, fade("in"))
    take(_FADE_OUT, fade("out"))
    for name, pattern in _TRANSITIONS:
        take(pattern, transition(name))
    take(_SLIDESHOW, lambda match: None)
    take(_FILLER, lambda match: None)
    found.sort(key=lambda item: item[0])
    plan.moves = [move for _, move in found]
    pieces = [_CONNECTORS.sub("", piece.strip()).strip() for piece in re.split(r"[,;]", text)]
    plan.rest = ", ".join(piece for piece in pieces if piece)
    return plan
