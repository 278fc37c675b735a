"""The words of the vocabulary: amounts, colors, positions, aspect names, and the synonyms
and typo correction that ``thinking=enabled`` adds. Data and small readers only; the
operation patterns live in ``_parser``."""

from __future__ import annotations

import difflib
import re

from PIL import ImageColor

NUM = r"(\d+(?:\.\d+)?)"
AND = r"(?:and|_and_|&|n)"

SLIGHT_RE = re.compile(
    r"\b(?:slight(?:ly)?|a\s+(?:little|bit|touch|tad)(?:\s+bit)?|subtl[ey]|gentl[ey]|mild(?:ly)?|"
    r"somewhat|light(?:ly)?|small)\b"
)
STRONG_RE = re.compile(
    r"\b(?:a\s+lot|much|strong(?:ly)?|heav(?:y|ily)|significant(?:ly)?|dramatic(?:ally)?|very|"
    r"lots|extreme(?:ly)?|greatly|considerabl[ey]|massive(?:ly)?|big|large|huge|intense(?:ly)?)\b"
)
PERCENT_RE = re.compile(rf"\b(by|to|at|of)?\s*{NUM}\s*(?:%|percent\b|per\s*cent\b)")
PX_RE = re.compile(rf"{NUM}\s*(?:px|pixels?)\b")


def _color_names() -> list[str]:
    names = set(ImageColor.colormap) | {"grey", "gold", "silver", "transparent"}
    return sorted(names, key=len, reverse=True)


COLOR_RE = re.compile(
    r"#[0-9a-f]{6}\b|#[0-9a-f]{3}\b|\b(?:" + "|".join(re.escape(n) for n in _color_names()) + r")\b"
)
COLOR_PREFIX_RE = re.compile(
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
SYNONYMS: tuple[tuple[re.Pattern[str], str], ...] = tuple(
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
        # "in the style of a mosaic" and "mosaic style" name the neural look instead.
        (
            r"(?<!style of )(?<!style of a )(?<!style of the )"
            r"\b(?:mosaic|8[\s-]?bit|lego|blocky)\b(?!\s+(?:style|look|effect|filter)\b)",
            "pixelate",
        ),
        (r"\b(?:mirror\s+image)\b", "flip horizontally"),
    )
)

# Words typo correction may correct towards (thinking=enabled only).
VOCABULARY = frozenset(
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
WORD_RE = re.compile(r"[a-z]{4,}")


ASPECT_NAMES = {
    "square": (1.0, 1.0),
    "portrait": (3.0, 4.0),
    "landscape": (4.0, 3.0),
    "widescreen": (16.0, 9.0),
    "cinematic": (21.0, 9.0),
    "panorama": (3.0, 1.0),
    "panoramic": (3.0, 1.0),
}


def amount(text: str, default: float = 25.0) -> tuple[float, bool]:
    """(percent, absolute): 'by 20%' -> (20, False); 'to 120%' -> (120, True)."""
    match = PERCENT_RE.search(text)
    if match:
        return float(match.group(2)), match.group(1) == "to"
    if SLIGHT_RE.search(text):
        return 10.0, False
    if STRONG_RE.search(text):
        return 50.0, False
    return default, False


def intensity(text: str) -> str:
    if SLIGHT_RE.search(text):
        return "light"
    if STRONG_RE.search(text):
        return "strong"
    return "normal"


def position(text: str, default_v: str = "bottom", default_h: str = "center") -> str:
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


# Words that carry no instruction of their own once a clause's operation has taken the words
# it used: what is left of a clause beyond these is reported under ``info.ignored``.
FILLER = frozenset(
    """a an the it its it's this that these those them they me my our your of to for by
    with in on at into onto from as and or but so than then up down out over off all
    each every both whole entire image images picture pictures photo photos pic pics img
    please kindly can could would will you i we let let's just also too very really
    quite rather bit tad touch little lot lots much more less some any make made makes
    making turn turned give gives get apply applied add use using do does be is are was
    look looks like style effect filter tone version one two slightly slight lightly light
    strong strongly heavy heavily subtle subtly gentle gently mild mildly somewhat
    significantly dramatically greatly considerably massively intensely extremely
    increase increased decrease decreased raise boost reduce reduced lower higher
    enhance amplify bump pump max stronger weaker tone mute muted cut drop set change
    adjust adjusted tweak new nice good px pixel pixels level levels bits degree degrees
    deg percent per cent block blocks cell cells tile tiles square squares column columns
    cols row rows across wide tones shades steps colors colours ratio aspect size put place
    placed together vertical vertically horizontal horizontally""".split()  # noqa: SIM905
)
_TOKEN_RE = re.compile(r"[a-z0-9'_-]*[a-z0-9][a-z0-9'_-]*|⟦\d+⟧")


def leftover(masked: str) -> str:
    """The words of a clause no operation used and that are not filler, or ``""``."""
    kept: list[str] = []
    for part in re.split(r"\s{2,}", masked):
        words = [w.strip("_") for w in _TOKEN_RE.findall(part)]
        while words and (words[0] in FILLER or PERCENT_OR_NUMBER_RE.fullmatch(words[0])):
            words.pop(0)
        while words and (words[-1] in FILLER or PERCENT_OR_NUMBER_RE.fullmatch(words[-1])):
            words.pop()
        if words:
            kept.append(" ".join(words))
    return " ... ".join(kept)


PERCENT_OR_NUMBER_RE = re.compile(r"\d+(?:\.\d+)?(?:%|px|percent|x\d+)?")


def loosen(text: str, plan_notes: list[dict[str, str]]) -> str:
    for pattern, replacement in SYNONYMS:

        def repl(match: re.Match[str], replacement: str = replacement) -> str:
            plan_notes.append({"read": match.group(0), "as": replacement})
            return replacement

        text = pattern.sub(repl, text)

    def fix(match: re.Match[str]) -> str:
        word = match.group(0)
        if word in VOCABULARY or COLOR_RE.fullmatch(word):
            return word
        close = difflib.get_close_matches(word, VOCABULARY, n=1, cutoff=0.8)
        if close and close[0] != word:
            plan_notes.append({"read": word, "as": close[0]})
            return close[0]
        return word

    return WORD_RE.sub(fix, text)
