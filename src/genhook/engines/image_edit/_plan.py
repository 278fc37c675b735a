"""The edit plan: what a prompt was understood to ask for, in order.

The plan is returned to the user under ``info`` so they can see how their words were read;
every parameter is therefore plain JSON (numbers, strings, ``#rrggbb`` colors).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from genhook.engines.media import FitMode

# Operations applied on the final picture at output resolution, so lines and letters stay
# crisp whatever the input size.
FINISHING_OPS = frozenset({"border", "caption"})
COMBINE_OPS = frozenset({"side_by_side", "stack_vertical", "grid", "overlay", "blend"})
STYLE_OP = "style_transfer"


@dataclass(frozen=True, slots=True)
class OperationDoc:
    name: str
    description: str
    example: str


# The vocabulary, in the order the documentation and error messages list it.
OPERATIONS: tuple[OperationDoc, ...] = (
    OperationDoc("grayscale", "black and white", "make it black and white"),
    OperationDoc("sepia", "warm brown old-photo tone", "apply a sepia tone"),
    OperationDoc("invert", "photographic negative", "invert the colors"),
    OperationDoc(
        "brightness", "brighter or darker, optionally by N%", "increase brightness by 20%"
    ),
    OperationDoc("contrast", "more or less contrast, optionally by N%", "reduce contrast slightly"),
    OperationDoc("saturation", "more or less color, optionally by N%", "boost saturation by 40%"),
    OperationDoc("sharpness", "more or less sharpness, optionally by N%", "lower sharpness by 30%"),
    OperationDoc("blur", "Gaussian blur, optionally N px", "blur it by 6 px"),
    OperationDoc("sharpen", "unsharp-mask sharpening", "sharpen the photo"),
    OperationDoc("rotate", "rotate by N degrees (clockwise unless told)", "rotate 90 degrees"),
    OperationDoc("flip", "mirror horizontally or vertically", "flip vertically"),
    OperationDoc("crop", "crop to an aspect ratio", "crop to 16:9"),
    OperationDoc("pixelate", "large square pixels, optionally N px blocks", "pixelate it"),
    OperationDoc("posterize", "reduce each channel to N levels", "posterize to 4 levels"),
    OperationDoc("edges", "edge detection or outline drawing", "detect edges"),
    OperationDoc("sketch", "pencil sketch, optionally colored", "turn it into a pencil sketch"),
    OperationDoc("cartoon", "flat colors and ink outlines", "make it look like a cartoon"),
    OperationDoc("painting", "painterly stylization", "make it look like a painting"),
    OperationDoc("vignette", "darkened corners", "add a vignette"),
    OperationDoc(
        "style_transfer",
        "a neural style: one of the named looks, or the look of another input image",
        "in the style of a mosaic",
    ),
    OperationDoc("border", "a border or frame of a named color", "add a 40px gold border"),
    OperationDoc(
        "caption",
        "quoted text at a position in a color",
        'add the caption "Hello" at the top in yellow',
    ),
    OperationDoc("remove_background", "cut the subject out", "remove the background"),
    OperationDoc("blur_background", "blur everything but the subject", "blur the background"),
    OperationDoc(
        "color_background", "replace the background with a color", "make the background blue"
    ),
    OperationDoc("blur_faces", "blur every detected face", "blur the faces"),
    OperationDoc("pixelate_faces", "pixelate every detected face", "pixelate all faces"),
    OperationDoc("side_by_side", "images in a row", "put image 1 and image 2 side by side"),
    OperationDoc("stack_vertical", "images in a column", "stack the images vertically"),
    OperationDoc("grid", "images in a grid", "make a 2x2 grid"),
    OperationDoc(
        "overlay",
        "place one image onto another",
        "place image 2 onto image 1 at the top right at 30%",
    ),
    OperationDoc("blend", "mix images together", "blend image 1 and image 2 at 30%"),
    OperationDoc("resize", "only resize to the requested size", "resize it"),
)

OPERATION_NAMES: tuple[str, ...] = tuple(op.name for op in OPERATIONS)


def supported_operations_text() -> str:
    return ", ".join(OPERATION_NAMES)


@dataclass(frozen=True, slots=True)
class Step:
    """One instruction. ``targets`` are 0-based input indexes; empty means the whole picture."""

    op: str
    params: dict[str, Any] = field(default_factory=dict)
    targets: tuple[int, ...] = ()
    clause: str = ""

    def describe(self) -> dict[str, Any]:
        out: dict[str, Any] = {"op": self.op, **self.params}
        if self.targets:
            out["images"] = [t + 1 for t in self.targets]
        if self.clause:
            out["from"] = self.clause
        return out

    def label(self) -> str:
        bits = [self.op.replace("_", " ")]
        for key, value in self.params.items():
            bits.append(f"{key}={value}")
        if self.targets:
            bits.append("on image " + ", ".join(str(t + 1) for t in self.targets))
        return " ".join(bits)


@dataclass(frozen=True, slots=True)
class FitPolicy:
    mode: FitMode = "auto"
    pad_color: str = "#000000"


@dataclass(slots=True)
class EditPlan:
    steps: list[Step]
    fit: FitPolicy = field(default_factory=FitPolicy)
    ignored: list[str] = field(default_factory=list)
    interpretations: list[dict[str, str]] = field(default_factory=list)

    @property
    def combine(self) -> Step | None:
        return next((s for s in self.steps if s.op in COMBINE_OPS), None)

    @property
    def style_sources(self) -> frozenset[int]:
        """0-based inputs that only lend their style: they are no part of the output."""
        return frozenset(
            int(s.params["style_image"]) - 1
            for s in self.steps
            if s.op == STYLE_OP and "style_image" in s.params
        )

    def summary(self) -> str:
        return ", then ".join(step.label() for step in self.steps)

    def describe(self) -> list[dict[str, Any]]:
        return [step.describe() for step in self.steps]
