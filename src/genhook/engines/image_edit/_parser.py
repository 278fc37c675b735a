"""Prompt to edit plan: a small, deterministic, documented vocabulary.

The prompt is cut into clauses (``_clauses``); each clause is matched against the operation
patterns in priority order, so "blur the background" is never
read as a plain blur. ``loose`` (``thinking=enabled``) adds synonyms ("vintage" -> sepia) and
typo correction, and records every such reinterpretation so the user can see it.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from genhook.engines.image_edit._clauses import PLACEHOLDER_RE, refs_in, split_prompt
from genhook.engines.image_edit._plan import (
    COMBINE_OPS,
    STYLE_OP,
    EditPlan,
    FitPolicy,
    Step,
    supported_operations_text,
)
from genhook.engines.image_edit._words import (
    AND,
    ASPECT_NAMES,
    COLOR_RE,
    NUM,
    PERCENT_RE,
    PX_RE,
    amount,
    color_hex,
    intensity,
    leftover,
    loosen,
    position,
)
from genhook.engines.media import FitMode
from genhook.engines.style_names import STYLE_NAMES
from genhook.errors import ErrorCode, TaskFailure


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


def _nearest_color(clause: _Clause, anchor: int) -> tuple[str, re.Match[str]] | None:
    best: tuple[int, re.Match[str]] | None = None
    for match in COLOR_RE.finditer(clause.masked):
        distance = abs(match.start() - anchor)
        if best is None or distance < best[0]:
            best = (distance, match)
    if best is None:
        return None
    return color_hex(best[1].group(0)), best[1]


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


_CAPTION_WORDS = (
    r"\b(?:caption\w*|text|title\w*|label\w*|write|written|words?|say(?:s|ing)?|reads?|heading|"
    r"headline|subtitle\w*|watermark\w*|signature|sign|slogan|quote|add|put|insert|type)\b"
)


def _m_caption(c: _Clause, ctx: _Context) -> None:
    if not c.quotes:
        return
    keyword = re.search(_CAPTION_WORDS, c.masked)
    placeholder = PLACEHOLDER_RE.search(c.masked)
    if placeholder is None or (keyword is None and not ctx.loose):
        return
    text = c.quotes[int(placeholder.group(1))]
    rest = c.masked.replace(placeholder.group(0), " " * len(placeholder.group(0)))
    params: dict[str, Any] = {"text": text, "position": position(rest)}
    color_match = re.search(
        r"\b(?:in|colou?red)\s+(" + COLOR_RE.pattern + r")|(" + COLOR_RE.pattern + r")\s+"
        r"(?:text|letters|font|caption|words?|title)",
        rest,
    )
    if color_match:
        name = color_match.group(1) or color_match.group(2)
        params["color"] = color_hex(name) if name != "transparent" else "#ffffff"
    else:
        params["color"] = "#ffffff"
    size = intensity(re.sub(r"\blight(?:ly)?\b", " ", rest))
    params["size"] = {"light": "small", "strong": "large"}.get(size, "medium")
    if re.search(r"\b(?:tiny|small)\b", rest):
        params["size"] = "small"
    c.take(placeholder, Step("caption", params, tuple(c.refs), c.original), keyword, color_match)
    c.take_all(
        r"\b(?:top|upper|above|header|bottom|lower|below|footer|middle|cent(?:er|re)|left|right|"
        r"corner|tiny|small|medium|big|large|huge)\b"
    )
    c.take_all(_CAPTION_WORDS)


_STYLE_LEAD = (
    r"\b(?:in\s+(?:the\s+)?(?:style|manner|look)\s+of|(?:with|using|use|apply|take)\s+(?:the\s+)?"
    r"(?:style|look)\s+of|styl(?:e|ed|ised|ized)\s+(?:like|after|as)|look(?:s|ing)?\s+like)\b"
)


def _m_style(c: _Clause, ctx: _Context) -> None:
    """A named look ("in the style of a mosaic", "mosaic style") or another input's look
    ("in the style of the second image")."""
    lead = re.search(_STYLE_LEAD, c.masked)
    named = re.search(
        rf"{_STYLE_LEAD}\s+(?:an?\s+|the\s+)?({'|'.join(STYLE_NAMES)})\b|"
        rf"\b({'|'.join(STYLE_NAMES)})\s+(?:style|look|effect|filter)\b|"
        rf"\bstyle\s*:?\s+({'|'.join(STYLE_NAMES)})\b",
        c.masked,
    )
    if named:
        name = next(g for g in named.groups() if g)
        content = tuple(c.refs)
        c.take(named, Step(STYLE_OP, {"style": name}, content, c.original))
        return
    if lead is None or not c.refs:
        return  # an unknown style is left for the other matchers, then listed as ignored
    # The image named right after "in the style of" is the style; the others are restyled.
    after = re.search(_STYLE_LEAD, c.original)
    named_after = refs_in(c.original[after.end() :], ctx.image_count) if after else []
    if lead.group(0).startswith("look") and not named_after:
        return  # "make image 2 look like a painting" is a painting
    source = named_after[0] if named_after else c.refs[-1]
    content = tuple(r for r in c.refs if r != source)
    params = {"style": f"image {source + 1}", "style_image": source + 1}
    c.take(lead, Step(STYLE_OP, params, content, c.original))


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
        strength = intensity(text)
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
    params = {"strength": intensity(c.masked)}
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
        weight = PERCENT_RE.search(text)
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
            params = {"position": position(text, default_v="center", default_h="center")}
            scale = PERCENT_RE.search(text)
            params["scale_percent"] = float(scale.group(2)) if scale else 30.0
            if not scale and re.search(r"\bhalf\b", text):
                params["scale_percent"] = 50.0
            elif not scale and intensity(text) == "light":
                params["scale_percent"] = 20.0
            step = Step("overlay", params, (placed, base), c.original)
    if step is not None and match is not None:
        c.take(match, step, PERCENT_RE.search(text))
        c.take_all(r"\b(?:top|upper|bottom|lower|left|right|middle|cent(?:er|re)|corner|half)\b")


def _m_border(c: _Clause, ctx: _Context) -> None:
    match = re.search(r"\b(?:border(?:s|ed)?|frame[ds]?|framing|matte)\b", c.masked)
    if not match:
        return
    params: dict[str, Any] = {}
    color = _nearest_color(c, match.start())
    params["color"] = color[0] if color and color[0] != "transparent" else "#000000"
    if px := PX_RE.search(c.masked):
        params["width_px"] = float(px.group(1))
    elif pct := PERCENT_RE.search(c.masked):
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
        PX_RE.search(c.masked) or PERCENT_RE.search(c.masked),
    )
    c.take_all(r"\b(?:thin|narrow|fine|hairline|thick|wide|heavy|broad|fat)\b")


def _m_crop(c: _Clause, ctx: _Context) -> None:
    text = c.masked
    verb = re.search(r"\b(?:crop(?:ped|ping)?|trim(?:med)?|cut)\b", text)
    square = re.search(r"\b(?:make|turn)\s+(?:it\s+|the\s+\w+\s+|this\s+)?(?:a\s+)?square\b", text)
    aspect_word = re.search(r"\baspect(?:\s+ratio)?\b", text)
    if not (verb or square or aspect_word):
        return
    ratio: tuple[float, float] | None = None
    ratio_match = re.search(rf"\b{NUM}\s*[:x×/]\s*{NUM}\b", text)
    name_match = re.search(r"\b(" + "|".join(ASPECT_NAMES) + r")\b", text)
    if ratio_match:
        ratio = (float(ratio_match.group(1)), float(ratio_match.group(2)))
    elif name_match:
        ratio = ASPECT_NAMES[name_match.group(1)]
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
        percent, absolute = amount(text)
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
        if m := PERCENT_RE.search(c.masked):
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
    if px := PX_RE.search(text):
        return {"radius_px": float(px.group(1))}
    return {"strength": intensity(text)}


def _pixelate_params(text: str) -> dict[str, Any]:
    if m := re.search(r"(\d+)\s*(?:px|pixels?)?\s*(?:blocks?|cells?|squares?|tiles?)\b", text):
        return {"block_px": int(m.group(1))}
    if m := re.search(r"\b(?:block|cell)\s*size\s*(?:of\s*)?(\d+)", text) or PX_RE.search(text):
        return {"block_px": int(float(m.group(1)))}
    return {"strength": intensity(text)}


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
    percent, _ = amount(text, default=50.0)
    if not PERCENT_RE.search(text):
        percent = {"light": 30.0, "strong": 75.0}.get(intensity(text), 50.0)
    return {"strength_percent": min(percent, 100.0)}


def _sharpen_params(text: str) -> dict[str, Any]:
    percent, _ = amount(text, default=100.0)
    if not PERCENT_RE.search(text):
        percent = {"light": 60.0, "strong": 200.0}.get(intensity(text), 120.0)
    return {"amount_percent": percent}


_MATCHERS: tuple[Matcher, ...] = (
    _m_fit,
    _m_caption,
    _m_style,
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
        rf"\bblack[\s-]+{AND}[\s-]+white\b|\bb\s*/\s*w\b|\bb\s*_and_\s*w\b|\bgr[ae]y[\s-]?scale\b|"
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


def parse_prompt(prompt: str, image_count: int, *, loose: bool) -> EditPlan:
    """Parse ``prompt`` into an ordered plan; raise ``TaskFailure`` when nothing is understood."""
    raw_clauses, quotes = split_prompt(prompt, image_count)
    ctx = _Context(image_count=image_count, loose=loose)
    plan = EditPlan(steps=[])
    for raw in raw_clauses:
        body = loosen(raw.body, plan.interpretations) if loose else raw.body
        clause = _Clause(text=body, original=raw.original, refs=raw.refs, quotes=quotes)
        fit_before = ctx.fit
        for matcher in _MATCHERS:
            matcher(clause, ctx)
        clause.found.sort(key=lambda item: item[0])
        plan.steps.extend(step for _, step in clause.found)
        if not clause.found and ctx.fit is fit_before:
            plan.ignored.append(raw.original)
        elif rest := leftover(clause.masked):
            plan.ignored.append(PLACEHOLDER_RE.sub(lambda m: f'"{quotes[int(m.group(1))]}"', rest))
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
