"""Prompt to edit plan: a small, deterministic, documented vocabulary.

The prompt is cut into clauses (commas, semicolons, sentences, "and", "then"); each clause is
matched against the operation patterns in priority order, so "blur the background" is never
read as a plain blur. ``loose`` (``thinking=enabled``) adds synonyms ("vintage" -> sepia) and
typo correction, and records every such reinterpretation so the user can see it.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from PIL import ImageColor

from genhook.engines.image_edit._plan import (
    COMBINE_OPS,
    EditPlan,
    FitMode,
    FitPolicy,
    Step,
    supported_operations_text,
)
from genhook.errors import ErrorCode, TaskFailure

NUM = r"(\d+(?:\.\d+)?)"
_AND = r"(?:and|_and_|&|n)"
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
_PLACEHOLDER_RE = re.compile(r"⟦(\d+)⟧")

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

_SLIGHT_RE = re.compile(
    r"\b(?:slight(?:ly)?|a\s+(?:little|bit|touch|tad)(?:\s+bit)?|subtl[ey]|gentl[ey]|mild(?:ly)?|"
    r"somewhat|light(?:ly)?|small)\b"
)
_STRONG_RE = re.compile(
    r"\b(?:a\s+lot|much|strong(?:ly)?|heav(?:y|ily)|significant(?:ly)?|dramatic(?:ally)?|very|"
    r"lots|extreme(?:ly)?|greatly|considerabl[ey]|massive(?:ly)?|big|large|huge|intense(?:ly)?)\b"
)
_PERCENT_RE = re.compile(rf"\b(by|to|at|of)?\s*{NUM}\s*(?:%|percent\b|per\s*cent\b)")
_PX_RE = re.compile(rf"{NUM}\s*(?:px|pixels?)\b")


def _color_names() -> list[str]:
    names = set(ImageColor.colormap) | {"grey", "gold", "silver", "transparent"}
    return sorted(names, key=len, reverse=True)


_COLOR_RE = re.compile(
    r"#[0-9a-f]{6}\b|#[0-9a-f]{3}\b|\b(?:" + "|".join(re.escape(n) for n in _color_names()) + r")\b"
)
_COLOR_PREFIX_RE = re.compile(
    r"\b(light|dark|pale|deep|bright|medium)[\s-]+("
    + "|".join(re.escape(n) for n in sorted(ImageColor.colormap, key=len, reverse=True))
    + r")\b"
)


def color_hex(name: str) -> str:
    if name == "transparent":
        return "transparent"
    r, g, b = ImageColor.getrgb(name)[:3]
    return f"#{r:02x}{g:02x}{b:02x}"


# thinking=enabled: loose phrasing rewritten into the vocabulary before matching.
_SYNONYMS: tuple[tuple[re.Pattern[str], str], ...] = tuple(
    (re.compile(p), r)
    for p, r in (
        (r"\b(?:vintage|old[\s-]fashioned|old\s+photo|antique|retro|aged|nostalgic)\b", "sepia"),
        (r"\b(?:noir|colou?rless|drained\s+of\s+colou?r|no\s+colou?rs?)\b", "grayscale"),
        (r"\bmore\s+(?:vivid|vibrant|colou?rful)\b", "more saturation"),
        (r"\b(?:vivid|vibrant|punchy|pop(?:ping)?|colou?rful)\b", "more saturation"),
        (r"\b(?:muted|washed[\s-]out|faded|dull|less\s+colou?rful)\b", "less saturation"),
        (r"\b(?:moody|dramatic)\b", "more contrast"),
        (r"\b(?:flat|flatter)\b(?!\s+colou?rs?)", "less contrast"),
        (
            r"\b(?:dreamy|hazy|out\s+of\s+focus|defocus(?:ed)?|soft[\s-]focus|"
            r"soften(?!\s+(?:the\s+)?(?:contrast|colou?rs?|saturation|sharpness)))\b",
            "blur",
        ),
        (
            r"\b(?:crisp(?:er|en)?|clearer|more\s+detail(?:ed)?|enhance\s+(?:the\s+)?details?)\b",
            "sharpen",
        ),
        (
            r"\b(?:anonymi[sz]e|protect\s+the\s+privacy\s+of|hide\s+the\s+identit(?:y|ies)\s+of)"
            r"\s+(?:the\s+|all\s+|every\s+)?(?:people|persons?|everyone|everybody|subjects?|faces?)\b",
            "pixelate faces",
        ),
        (r"\b(?:bokeh|portrait\s+mode|shallow\s+depth\s+of\s+field)\b", "blur the background"),
        (
            r"\b(?:isolate|cut\s+out|extract)\s+(?:the\s+)?(?:subject|person|people|object|foreground)\b",
            "remove the background",
        ),
        (r"\b(?:comic(?:\s+book)?|anime|manga|toon|cel[\s-]shaded)\b", "cartoon"),
        (
            r"\b(?:oil(?:\s+painting)?|watercolou?r|impressionis\w*|artistic|painterly)\b",
            "painting",
        ),
        (r"\b(?:drawing|charcoal|hand[\s-]drawn)\b", "pencil sketch"),
        (r"\b(?:mosaic|8[\s-]?bit|lego|blocky)\b", "pixelate"),
        (r"\b(?:mirror\s+image)\b", "flip horizontally"),
    )
)

# Words typo correction may correct towards (thinking=enabled only).
_VOCABULARY = frozenset(
    [
        "grayscale",
        "greyscale",
        "monochrome",
        "sepia",
        "invert",
        "negative",
        "brightness",
        "brighter",
        "brighten",
        "darker",
        "darken",
        "lighter",
        "lighten",
        "contrast",
        "saturation",
        "saturate",
        "desaturate",
        "sharpness",
        "sharpen",
        "blur",
        "blurry",
        "rotate",
        "rotation",
        "clockwise",
        "counterclockwise",
        "anticlockwise",
        "degrees",
        "flip",
        "mirror",
        "horizontally",
        "vertically",
        "horizontal",
        "vertical",
        "crop",
        "square",
        "widescreen",
        "portrait",
        "landscape",
        "cinematic",
        "pixelate",
        "posterize",
        "levels",
        "edges",
        "outline",
        "sketch",
        "pencil",
        "cartoon",
        "painting",
        "vignette",
        "border",
        "frame",
        "caption",
        "text",
        "title",
        "background",
        "remove",
        "transparent",
        "faces",
        "face",
        "blend",
        "grid",
        "collage",
        "overlay",
        "stack",
        "side",
        "columns",
        "resize",
        "upscale",
        "letterbox",
        "stretch",
        "increase",
        "decrease",
        "reduce",
        "boost",
        "lower",
    ]
)
_WORD_RE = re.compile(r"[a-z]{4,}")


@dataclass(slots=True)
class _Clause:
    text: str  # lowercased, quotes replaced by placeholders, image references blanked
    original: str
    refs: list[int]  # 0-based image indexes named in the clause, in order
    quotes: list[str]
    masked: str = ""
    found: list[tuple[int, Step]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.masked = self.text

    def take(self, match: re.Match[str], step: Step | None, *also: re.Match[str] | None) -> None:
        """Record ``step`` at ``match`` and blank the words it used, so no later matcher reuses
        them; the rest of the clause stays available ("grayscale with a red border")."""
        for used in (match, *also):
            if used is not None:
                start, end = used.span()
                self.masked = self.masked[:start] + " " * (end - start) + self.masked[end:]
        if step is not None:
            self.found.append((match.start(), step))

    def take_all(self, pattern: str) -> None:
        for match in list(re.finditer(pattern, self.masked)):
            self.take(match, None)


@dataclass(slots=True)
class _Context:
    image_count: int
    loose: bool
    fit: FitPolicy | None = None


def _amount(text: str, default: float = 25.0) -> tuple[float, bool]:
    """(percent, absolute): 'by 20%' -> (20, False); 'to 120%' -> (120, True)."""
    match = _PERCENT_RE.search(text)
    if match:
        return float(match.group(2)), match.group(1) == "to"
    if _SLIGHT_RE.search(text):
        return 10.0, False
    if _STRONG_RE.search(text):
        return 50.0, False
    return default, False


def _intensity(text: str) -> str:
    if _SLIGHT_RE.search(text):
        return "light"
    if _STRONG_RE.search(text):
        return "strong"
    return "normal"


def _nearest_color(clause: _Clause, anchor: int) -> tuple[str, re.Match[str]] | None:
    best: tuple[int, re.Match[str]] | None = None
    for match in _COLOR_RE.finditer(clause.masked):
        distance = abs(match.start() - anchor)
        if best is None or distance < best[0]:
            best = (distance, match)
    if best is None:
        return None
    return color_hex(best[1].group(0)), best[1]


def _position(text: str, default_v: str = "bottom", default_h: str = "center") -> str:
    vertical = default_v
    horizontal = default_h
    if re.search(r"\b(?:top|upper|above|header)\b", text):
        vertical = "top"
    elif re.search(r"\b(?:bottom|lower|below|footer)\b", text):
        vertical = "bottom"
    elif re.search(r"\b(?:middle|cent(?:er|re))\b", text) and not re.search(
        r"\b(?:left|right)\b", text
    ):
        vertical = "center"
    if re.search(r"\bleft\b", text):
        horizontal = "left"
    elif re.search(r"\bright\b", text):
        horizontal = "right"
    if vertical == "center" and horizontal == "center":
        return "center"
    return f"{vertical}-{horizontal}" if vertical != "center" else f"center-{horizontal}"


Matcher = Callable[[_Clause, _Context], None]


def _m_fit(c: _Clause, ctx: _Context) -> None:
    contain = re.search(
        r"\b(?:letterbox\w*|pillarbox\w*|pad(?:ded|ding)?|no\s+crop\w*|(?:don'?t|do\s+not|without)\s+"
        r"crop\w*|(?:keep|preserve|show)\s+(?:the\s+)?(?:whole|entire|full|complete)\s+"
        r"(?:image|picture|photo)|fit\s+(?:it\s+)?(?:inside|within))\b",
        c.masked,
    )
    mode: FitMode | None = None
    match = contain
    if contain:
        mode = "contain"
    elif m := re.search(r"\bstretch(?:ed|ing)?\b(?:\s+(?:it|to\s+fit))?", c.masked):
        mode, match = "stretch", m
    elif m := re.search(
        r"\b(?:fill|cover)\s+(?:the\s+)?(?:frame|canvas|output)\b|\bcrop\s+to\s+fill\b", c.masked
    ):
        mode, match = "cover", m
    if mode is None or match is None:
        return
    pad = "#000000"
    if mode == "contain" and (color := _nearest_color(c, match.start())):
        pad = color[0] if color[0] != "transparent" else pad
        c.take(color[1], None)
    ctx.fit = FitPolicy(mode=mode, pad_color=pad)
    c.take(match, None)


def _m_caption(c: _Clause, ctx: _Context) -> None:
    if not c.quotes:
        return
    keyword = re.search(
        r"\b(?:caption\w*|text|title\w*|label\w*|write|written|words?|say(?:s|ing)?|reads?|heading|"
        r"headline|subtitle\w*|watermark\w*|signature|sign|slogan|quote|add|put|insert|type)\b",
        c.masked,
    )
    placeholder = _PLACEHOLDER_RE.search(c.masked)
    if placeholder is None or (keyword is None and not ctx.loose):
        return
    text = c.quotes[int(placeholder.group(1))]
    rest = c.masked.replace(placeholder.group(0), " " * len(placeholder.group(0)))
    params: dict[str, Any] = {"text": text, "position": _position(rest)}
    color_match = re.search(
        r"\b(?:in|colou?red)\s+(" + _COLOR_RE.pattern + r")|(" + _COLOR_RE.pattern + r")\s+"
        r"(?:text|letters|font|caption|words?|title)",
        rest,
    )
    if color_match:
        name = color_match.group(1) or color_match.group(2)
        params["color"] = color_hex(name) if name != "transparent" else "#ffffff"
    else:
        params["color"] = "#ffffff"
    size = _intensity(re.sub(r"\blight(?:ly)?\b", " ", rest))
    params["size"] = {"light": "small", "strong": "large"}.get(size, "medium")
    if re.search(r"\b(?:tiny|small)\b", rest):
        params["size"] = "small"
    c.take(placeholder, Step("caption", params, tuple(c.refs), c.original), keyword, color_match)
    c.take_all(
        r"\b(?:top|upper|above|header|bottom|lower|below|footer|middle|cent(?:er|re)|left|right|"
        r"corner|tiny|small|medium|big|large|huge)\b"
    )


def _m_background(c: _Clause, ctx: _Context) -> None:
    bg = re.search(r"\bbackground\b|\bbackdrop\b", c.masked)
    if not bg:
        return
    text = c.masked
    remove = re.search(
        r"\b(?:remove|delete|erase|cut\s*out|get\s+rid\s+of|drop|strip|eliminate|clear)\b|"
        r"\btransparent\b|\bremov(?:al|ed)\b",
        text,
    )
    blur = re.search(r"\bblur\w*|\bdefocus\w*|\bsoft(?:en)?\b", text)
    color = _nearest_color(c, bg.start())
    step: Step | None = None
    if blur:
        strength = _intensity(text)
        step = Step("blur_background", {"strength": strength}, tuple(c.refs), c.original)
    elif color and color[0] != "transparent":
        step = Step("color_background", {"color": color[0]}, tuple(c.refs), c.original)
    elif remove:
        step = Step("remove_background", {}, tuple(c.refs), c.original)
    if step is not None:
        c.take(
            bg,
            step,
            blur if step.op == "blur_background" else None,
            color[1] if color and step.op == "color_background" else None,
            remove if step.op == "remove_background" else None,
        )


def _m_faces(c: _Clause, ctx: _Context) -> None:
    face = re.search(r"\bfaces?\b|\bfacial\b", c.masked)
    if not face:
        return
    verb = re.search(
        r"\b(?:blur\w*|pixel\w*|mosaic|hide|hidden|censor\w*|mask\w*|obscur\w*|anonymi[sz]\w*|"
        r"cover\w*|redact\w*)\b",
        c.masked,
    )
    if not verb:
        return
    pixel = re.match(r"pixel|mosaic|hid|censor|mask|cover|redact", verb.group(0))
    op = "pixelate_faces" if pixel else "blur_faces"
    params = {"strength": _intensity(c.masked)}
    c.take(face, Step(op, params, tuple(c.refs), c.original), verb)


def _m_combine(c: _Clause, ctx: _Context) -> None:
    text = c.masked
    refs = tuple(c.refs)
    step: Step | None = None
    match: re.Match[str] | None
    params: dict[str, Any]
    if match := re.search(
        r"\bgrid\b|\bcollage\b|\btile[ds]?\b|\bcontact\s+sheet\b|\bmontage\b", text
    ):
        params = {}
        if cols := re.search(r"(\d+)\s*(?:columns?|cols?|across|wide)\b", text):
            params["columns"] = int(cols.group(1))
        elif dims := re.search(r"\b(\d+)\s*[x×]\s*(\d+)\b", text):
            params["columns"] = int(dims.group(1))
        step = Step("grid", params, refs, c.original)
    elif match := re.search(
        r"\bside[\s-]+by[\s-]+side\b|\bnext\s+to\b|\bbeside\b|\bin\s+a\s+row\b|\bleft\s+_and_\s+right\b"
        r"|\bdiptych\b|\bbefore\s+_and_\s+after\b|\bhorizontal(?:ly)?\b(?=.*\b(?:stack|combine|join|"
        r"place|arrange|concatenat|put|merge))|\b(?:stack|combine|join|place|arrange|concatenat\w*|put)"
        r"\b(?=.*\bhorizontal(?:ly)?\b)",
        text,
    ):
        step = Step("side_by_side", {}, refs, c.original)
    elif match := re.search(r"\b(?:below|under(?:neath)?)\b", text):
        if len(refs) >= 2:
            step = Step("stack_vertical", {}, (refs[1], refs[0], *refs[2:]), c.original)
    elif match := re.search(
        r"\bvertical(?:ly)?\b(?=.*\b(?:stack|combine|join|place|arrange|put|concatenat))|"
        r"\b(?:stack\w*|combine|join|place|arrange|put|concatenat\w*)\b(?=.*\bvertical(?:ly)?\b)|"
        r"\bone\s+(?:above|over|below|under)\s+the\s+other\b|\btop\s+_and_\s+bottom\b|"
        r"\bin\s+a\s+column\b|\bstack(?:ed|ing)?\b|\babove\b",
        text,
    ):
        if match.group(0) != "above" or len(refs) >= 2:
            step = Step("stack_vertical", {}, refs, c.original)
    elif match := re.search(
        r"\b(?:blend\w*|mix(?:ed|ing)?|merge[ds]?|merging|cross[\s-]?fade|double\s+exposure)\b",
        text,
    ):
        weight = _PERCENT_RE.search(text)
        params = {}
        if weight:
            params["weight_percent"] = float(weight.group(2))
        step = Step("blend", params, refs, c.original)
    if step is None and (
        match := re.search(
            r"\b(?:place|put|paste|overlay|insert|add|superimpose|stick|drop|layer)\b", text
        )
    ):
        onto = re.search(r"\b(?:on|onto|over|on\s+top\s+of|in|into|inside|atop|with)\b", text)
        if onto and (len(refs) >= 2 or re.search(r"\b(?:overlay|superimpose)\b", text)):
            if len(refs) >= 2:
                placed, base = refs[0], refs[1]
            elif len(refs) == 1:
                placed, base = refs[0], (0 if refs[0] != 0 else 1)
            else:
                placed, base = 1, 0
            if re.search(r"\boverlay\b.*\bwith\b", text) and len(refs) >= 2:
                placed, base = refs[1], refs[0]
            params = {"position": _position(text, default_v="center", default_h="center")}
            scale = _PERCENT_RE.search(text)
            params["scale_percent"] = float(scale.group(2)) if scale else 30.0
            if not scale and re.search(r"\bhalf\b", text):
                params["scale_percent"] = 50.0
            elif not scale and _intensity(text) == "light":
                params["scale_percent"] = 20.0
            step = Step("overlay", params, (placed, base), c.original)
    if step is not None and match is not None:
        c.take(match, step, _PERCENT_RE.search(text))
        c.take_all(r"\b(?:top|upper|bottom|lower|left|right|middle|cent(?:er|re)|corner|half)\b")


def _m_border(c: _Clause, ctx: _Context) -> None:
    match = re.search(r"\b(?:border(?:s|ed)?|frame[ds]?|framing|matte)\b", c.masked)
    if not match:
        return
    params: dict[str, Any] = {}
    color = _nearest_color(c, match.start())
    params["color"] = color[0] if color and color[0] != "transparent" else "#000000"
    if px := _PX_RE.search(c.masked):
        params["width_px"] = float(px.group(1))
    elif pct := _PERCENT_RE.search(c.masked):
        params["width_percent"] = float(pct.group(2))
    elif re.search(r"\b(?:thin|narrow|fine|hairline)\b", c.masked):
        params["width_percent"] = 1.5
    elif re.search(r"\b(?:thick|wide|heavy|broad|fat)\b", c.masked):
        params["width_percent"] = 6.0
    else:
        params["width_percent"] = 3.0
    c.take(
        match,
        Step("border", params, tuple(c.refs), c.original),
        color[1] if color else None,
        _PX_RE.search(c.masked) or _PERCENT_RE.search(c.masked),
    )
    c.take_all(r"\b(?:thin|narrow|fine|hairline|thick|wide|heavy|broad|fat)\b")


_ASPECT_NAMES = {
    "square": (1.0, 1.0),
    "portrait": (3.0, 4.0),
    "landscape": (4.0, 3.0),
    "widescreen": (16.0, 9.0),
    "cinematic": (21.0, 9.0),
    "panorama": (3.0, 1.0),
    "panoramic": (3.0, 1.0),
}


def _m_crop(c: _Clause, ctx: _Context) -> None:
    text = c.masked
    verb = re.search(r"\b(?:crop(?:ped|ping)?|trim(?:med)?|cut)\b", text)
    square = re.search(r"\b(?:make|turn)\s+(?:it\s+|the\s+\w+\s+|this\s+)?(?:a\s+)?square\b", text)
    aspect_word = re.search(r"\baspect(?:\s+ratio)?\b", text)
    if not (verb or square or aspect_word):
        return
    ratio: tuple[float, float] | None = None
    ratio_match = re.search(rf"\b{NUM}\s*[:x×/]\s*{NUM}\b", text)
    name_match = re.search(r"\b(" + "|".join(_ASPECT_NAMES) + r")\b", text)
    if ratio_match:
        ratio = (float(ratio_match.group(1)), float(ratio_match.group(2)))
    elif name_match:
        ratio = _ASPECT_NAMES[name_match.group(1)]
    elif square:
        ratio = (1.0, 1.0)
    if ratio is None:
        if verb and verb.group(0).startswith("crop"):
            raise TaskFailure(
                ErrorCode.INSTRUCTION_INVALID,
                f"cannot apply {c.original!r}: crop needs an aspect ratio, "
                "e.g. 'crop to 16:9' or 'crop to square'",
            )
        return
    if ratio[0] <= 0 or ratio[1] <= 0 or not 1 / 16 <= ratio[0] / ratio[1] <= 16:
        raise TaskFailure(
            ErrorCode.INSTRUCTION_INVALID,
            f"cannot apply {c.original!r}: the aspect ratio must be between 1:16 and 16:1",
        )
    anchor = "center"
    for word in ("top", "bottom", "left", "right"):
        if re.search(rf"\b{word}\b", text):
            anchor = word
            break
    params = {"aspect": f"{ratio[0]:g}:{ratio[1]:g}", "anchor": anchor}
    anchor_match = verb or square or aspect_word
    assert anchor_match is not None
    step = Step("crop", params, tuple(c.refs), c.original)
    c.take(
        anchor_match,
        step,
        ratio_match,
        name_match,
        aspect_word if aspect_word is not anchor_match else None,
    )
    c.take_all(r"\b(?:top|bottom|left|right|cent(?:er|re))\b")


def _m_flip(c: _Clause, ctx: _Context) -> None:
    match = re.search(r"\b(?:flip(?:ped|s)?|mirror(?:ed|s)?|reflect(?:ed)?)\b", c.masked)
    if not match:
        return
    vertical = re.search(
        r"\bvertical(?:ly)?\b|\bupside[\s-]down\b|\btop[\s-](?:to|_and_)[\s-]bottom\b|\bup[\s-]down\b",
        c.masked,
    )
    axis = "vertical" if vertical else "horizontal"
    c.take(match, Step("flip", {"axis": axis}, tuple(c.refs), c.original), vertical)
    c.take_all(r"\bhorizontal(?:ly)?\b|\bsideways\b|\bleft[\s-]to[\s-]right\b")


def _m_rotate(c: _Clause, ctx: _Context) -> None:
    text = c.masked
    verb = re.search(r"\b(?:rotat\w*|spin|tilt(?:ed)?|turn(?:ed)?)\b", text)
    upside = re.search(r"\bupside[\s-]down\b", text)
    if not verb and not upside:
        return
    degrees: float | None = None
    if (m := re.search(r"(-?\d+(?:\.\d+)?)\s*(?:°|º|degrees?\b|deg\b)", text)) or (
        verb
        and (
            m := re.search(
                r"\b(?:rotat\w*|spin|tilt\w*|turn\w*)\s+(?:it\s+)?(?:by\s+)?(-?\d+)\b", text
            )
        )
    ):
        degrees = float(m.group(1))
    elif re.search(r"\bquarter[\s-]turn\b", text):
        degrees = 90.0
    elif re.search(r"\bhalf[\s-]turn\b|\bupside[\s-]down\b", text):
        degrees = 180.0
    ccw = re.search(
        r"\bcounter[\s-]?clockwise\b|\banti[\s-]?clockwise\b|\bccw\b|\bleft(?:wards)?\b", text
    )
    cw = re.search(r"\bclockwise\b|\bcw\b|\bright(?:wards)?\b", text)
    if degrees is None:
        if verb and verb.group(0).startswith("turn") and not (ccw or cw):
            return  # "turn it into a painting" is no rotation
        degrees = 10.0 if verb and verb.group(0).startswith("tilt") else 90.0
    clockwise = degrees if not ccw else -degrees
    clockwise = ((clockwise + 180.0) % 360.0) - 180.0
    if clockwise == -180.0:
        clockwise = 180.0
    anchor = verb or upside
    assert anchor is not None
    step = Step("rotate", {"degrees_clockwise": clockwise}, tuple(c.refs), c.original)
    c.take(anchor, step, upside if upside is not anchor else None, ccw or cw)
    c.take_all(rf"-?{NUM}\s*(?:°|º|degrees?\b|deg\b)?|\b(?:quarter|half)[\s-]turn\b")


_ADJUST_PROPS: tuple[tuple[str, str], ...] = (
    (
        "brightness",
        r"\b(?:bright(?:ness|er|en)?|light(?:er|en)|exposure|dark(?:er|en)|dim(?:mer)?)\b",
    ),
    ("contrast", r"\bcontrast\w*\b"),
    ("saturation", r"\b(?:saturat\w*|desaturat\w*|vibranc[ey]|colou?r\s+intensity)\b"),
    ("sharpness", r"\bsharpness\b"),
)
_UP_RE = re.compile(
    r"\b(?:increase[sd]?|raise|boost|more|higher|up|enhance|amplify|add|stronger|bump|brighter|"
    r"brighten|lighter|lighten|pump|max|saturate)\b"
)
_DOWN_RE = re.compile(
    r"\b(?:decrease[sd]?|reduce[sd]?|lower|less|down|darker|darken|dim|dimmer|weaker|tone\s+down|"
    r"soften|desaturat\w*|drop|cut|mute|muted)\b"
)


def _m_adjust(c: _Clause, ctx: _Context) -> None:
    for prop, pattern in _ADJUST_PROPS:
        match = re.search(pattern, c.masked)
        if not match:
            continue
        text = c.masked
        percent, absolute = _amount(text)
        if absolute:
            factor = percent / 100.0
        else:
            up_word, down_word = _UP_RE.search(text), _DOWN_RE.search(text)
            down = down_word is not None and (
                up_word is None or down_word.start() < up_word.start()
            )
            if prop == "saturation" and match.group(0).startswith("desaturat"):
                down = True
            factor = 1.0 - percent / 100.0 if down else 1.0 + percent / 100.0
        factor = round(max(0.0, min(factor, 5.0)), 4)
        if factor == 1.0:
            raise TaskFailure(
                ErrorCode.INSTRUCTION_INVALID,
                f"cannot apply {c.original!r}: it changes {prop} by 0%",
            )
        c.take(match, Step(prop, {"factor": factor}, tuple(c.refs), c.original))
        # Mask the rest of the clause's amount so another property does not reuse it.
        if m := _PERCENT_RE.search(c.masked):
            c.take(m, None)


def _simple(
    op: str, pattern: str, params: Callable[[str], dict[str, Any]] | None = None
) -> Matcher:
    regex = re.compile(pattern)

    def match(c: _Clause, ctx: _Context) -> None:
        if m := regex.search(c.masked):
            values = params(c.masked) if params else {}
            c.take(m, Step(op, values, tuple(c.refs), c.original))

    return match


def _blur_params(text: str) -> dict[str, Any]:
    if px := _PX_RE.search(text):
        return {"radius_px": float(px.group(1))}
    return {"strength": _intensity(text)}


def _pixelate_params(text: str) -> dict[str, Any]:
    if m := re.search(r"(\d+)\s*(?:px|pixels?)?\s*(?:blocks?|cells?|squares?|tiles?)\b", text):
        return {"block_px": int(m.group(1))}
    if m := re.search(r"\b(?:block|cell)\s*size\s*(?:of\s*)?(\d+)", text) or _PX_RE.search(text):
        return {"block_px": int(float(m.group(1)))}
    return {"strength": _intensity(text)}


def _posterize_params(text: str) -> dict[str, Any]:
    if m := re.search(r"(\d+)\s*bits?\b", text):
        levels = 2 ** max(1, min(int(m.group(1)), 6))
    elif m := re.search(r"(\d+)\s*(?:levels?|colou?rs?|tones?|shades?|steps?)\b", text):
        levels = int(m.group(1))
    else:
        levels = 4
    if not 2 <= levels <= 64:
        raise TaskFailure(
            ErrorCode.INSTRUCTION_INVALID, "posterize needs between 2 and 64 levels per channel"
        )
    return {"levels": levels}


def _edges_params(text: str) -> dict[str, Any]:
    lines = re.search(r"\boutline\w*|\bline\s*art\b|\bcontour\w*", text)
    return {"style": "dark_lines" if lines else "white_on_black"}


def _vignette_params(text: str) -> dict[str, Any]:
    percent, _ = _amount(text, default=50.0)
    if not _PERCENT_RE.search(text):
        percent = {"light": 30.0, "strong": 75.0}.get(_intensity(text), 50.0)
    return {"strength_percent": min(percent, 100.0)}


def _sharpen_params(text: str) -> dict[str, Any]:
    percent, _ = _amount(text, default=100.0)
    if not _PERCENT_RE.search(text):
        percent = {"light": 60.0, "strong": 200.0}.get(_intensity(text), 120.0)
    return {"amount_percent": percent}


_MATCHERS: tuple[Matcher, ...] = (
    _m_fit,
    _m_caption,
    _m_background,
    _m_faces,
    _m_combine,
    _m_border,
    _m_crop,
    _m_flip,
    _m_rotate,
    _m_adjust,
    _simple(
        "grayscale",
        rf"\bblack[\s-]+{_AND}[\s-]+white\b|\bb\s*/\s*w\b|\bb\s*_and_\s*w\b|\bgr[ae]y[\s-]?scale\b|"
        r"\bmonochrom\w*|\bmono\b|\bgr[ae]y[\s-]?tones?\b|\bmake\s+it\s+gr[ae]y\b",
    ),
    _simple("sepia", r"\bsepia\w*"),
    _simple("invert", r"\binvert\w*|\bnegative\b|\binverse\b"),
    _simple("sharpen", r"\bsharpen\w*", _sharpen_params),
    _simple("blur", r"\bblur\w*|\bgaussian\b", _blur_params),
    _simple("pixelate", r"\bpixel(?:ate\w*|ation|i[sz]\w*|li[sz]\w*|\s*art)\b", _pixelate_params),
    _simple(
        "posterize",
        r"\bposteri[sz]\w*|\bposter\b|\breduce\s+(?:the\s+)?(?:number\s+of\s+)?colou?rs\b",
        _posterize_params,
    ),
    _simple(
        "sketch",
        r"\b(?:pencil\s+)?sketch\w*|\bpencil\b",
        lambda t: {"colored": bool(re.search(r"\bcolou?r(?:ed|ful)?\b", t))},
    ),
    _simple(
        "edges",
        r"\bedges?\b(?:\s+(?:detection|detect\w*|map|effect|filter))?|\bdetect\s+(?:the\s+)?edges\b|"
        r"\boutline\w*|\bline\s*art\b|\bcontours?\b",
        _edges_params,
    ),
    _simple("cartoon", r"\bcartoon\w*"),
    _simple("painting", r"\bpaint\w*|\bstyli[sz]\w*"),
    _simple("vignette", r"\bvignett\w*", _vignette_params),
    _simple(
        "resize",
        r"\b(?:resiz\w*|rescal\w*|upscal\w*|downscal\w*|enlarg\w*|scale\s+(?:it\s+)?(?:up|down))\b",
    ),
)


def _extract_quotes(prompt: str) -> tuple[str, list[str]]:
    quotes: list[str] = []

    def repl(match: re.Match[str]) -> str:
        quotes.append(next(g for g in match.groups() if g is not None))
        return f" ⟦{len(quotes) - 1}⟧ "

    return _QUOTE_RE.sub(repl, prompt), quotes


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


def _loosen(text: str, plan_notes: list[dict[str, str]]) -> str:
    for pattern, replacement in _SYNONYMS:

        def repl(match: re.Match[str], replacement: str = replacement) -> str:
            plan_notes.append({"read": match.group(0), "as": replacement})
            return replacement

        text = pattern.sub(repl, text)

    def fix(match: re.Match[str]) -> str:
        word = match.group(0)
        if word in _VOCABULARY or _COLOR_RE.fullmatch(word):
            return word
        close = difflib.get_close_matches(word, _VOCABULARY, n=1, cutoff=0.8)
        if close and close[0] != word:
            plan_notes.append({"read": word, "as": close[0]})
            return close[0]
        return word

    return _WORD_RE.sub(fix, text)


def parse_prompt(prompt: str, image_count: int, *, loose: bool) -> EditPlan:
    """Parse ``prompt`` into an ordered plan; raise ``TaskFailure`` when nothing is understood."""
    text, quotes = _extract_quotes(prompt)
    text = text.lower()
    text = _COLOR_PREFIX_RE.sub(
        lambda m: (
            m.group(1) + m.group(2)
            if (m.group(1) + m.group(2)) in ImageColor.colormap
            else m.group(0)
        ),
        text,
    )
    for pattern, replacement in _PROTECT:
        text = pattern.sub(replacement, text)
    ctx = _Context(image_count=image_count, loose=loose)
    plan = EditPlan(steps=[])
    for raw in _SPLIT_RE.split(text):
        raw = raw.strip()
        if not raw:
            continue
        original = _PLACEHOLDER_RE.sub(lambda m: f'"{quotes[int(m.group(1))]}"', raw)
        original = original.replace("_and_", "and")
        body, refs = _resolve_refs(raw, image_count, original)
        if loose:
            body = _loosen(body, plan.interpretations)
        clause = _Clause(text=body, original=original, refs=refs, quotes=quotes)
        fit_before = ctx.fit
        for matcher in _MATCHERS:
            matcher(clause, ctx)
        clause.found.sort(key=lambda item: item[0])
        plan.steps.extend(step for _, step in clause.found)
        if not clause.found and ctx.fit is fit_before:
            plan.ignored.append(original)
    if ctx.fit is not None:
        plan.fit = ctx.fit
    combines = [s for s in plan.steps if s.op in COMBINE_OPS]
    if len(combines) > 1:
        raise TaskFailure(
            ErrorCode.INSTRUCTION_INVALID,
            "the prompt asks for more than one way to combine the images "
            f"({', '.join(s.op for s in combines)}); use one per task",
        )
    if combines and image_count < 2:
        raise TaskFailure(
            ErrorCode.INSTRUCTION_INVALID,
            f"{combines[0].op.replace('_', ' ')} needs at least two input images; the task has one",
        )
    if not plan.steps:
        hint = (
            " (a fit instruction alone is no edit; add 'resize' to only resize)"
            if ctx.fit is not None
            else ""
        )
        raise TaskFailure(
            ErrorCode.PROMPT_NOT_UNDERSTOOD,
            f"the prompt names no operation this engine supports{hint}. Supported operations: "
            f"{supported_operations_text()}. See docs/engines/image-edit.md for examples.",
        )
    return plan
