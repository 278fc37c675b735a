"""The wire schema of the image-edit request, every rule of it.

Validation failures surface as HTTP 400 with one entry per offending field, e.g.
``images[3]``; see ``docs/api.md``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictStr,
    ValidationInfo,
    field_validator,
)
from pydantic.config import JsonDict

from genhook.data_urls import InlineData, decode_data_url, inline_data, is_data_url
from genhook.media import ACCEPTED_FORMATS, sniff_image_format
from genhook.net._urls import TargetRefused, parse_target
from genhook.schema_marks import NO_EFFECT

ALLOWED_SIZES: tuple[str, ...] = (
    "2048*2048",
    "2304*1728",
    "1728*2304",
    "2720*1530",
    "1530*2720",
    "2496*1664",
    "1664*2496",
    "1024*1024",
    "1536*1536",
    "1776*1328",
    "1328*1776",
    "2048*1152",
    "1152*2048",
)
MIN_PIXELS = 1_048_576
MAX_PIXELS = 4_194_304
MAX_ASPECT = 16.0
MAX_IMAGES = 10
# What the schema can say of an ``images`` item (the rest, a decodable image or a fetchable
# URL, is checked at submit): an http(s) URL or a data URL.
IMAGE_ITEMS_SCHEMA: JsonDict = {
    "items": {
        "type": "string",
        "pattern": "^([Hh][Tt][Tt][Pp][Ss]?://|data:)",
        "description": "An http(s) URL of an image, or a base64 data URL of one.",
    }
}
MAX_PROMPT_CHARS = 20_000
MAX_IMAGE_URL_CHARS = 4096

_SIZE_RE = re.compile(r"^([1-9][0-9]{0,5})\*([1-9][0-9]{0,5})$")
# Raw base64 of an image: long, no scheme, only the base64 alphabet (the first bytes
# suffice: every JPEG, PNG and WebP encodes to a run of these).
_RAW_BASE64_RE = re.compile(r"[A-Za-z0-9+/]{64,}={0,2}")
_RAW_BASE64_PROBE = 256


IMAGE_REFS = "image_refs"


@dataclass(frozen=True, slots=True)
class ImageRef:
    """One input (an ``images`` item, or another model's input file): either a URL to fetch
    later or decoded data-URL bytes."""

    url: str | None = None
    # A memoryview for a large data URL: decoded in place, never copied.
    data: bytes | memoryview | None = None
    format: str | None = None
    # For non-image inputs: the stored blob's type and the request field errors name.
    content_type: str | None = None
    field: str | None = None


def parse_image_ref(value: str, inline: InlineData | None = None) -> ImageRef:
    """Parse one ``images`` item, or the placeholder of one left in the body's bytes
    (``inline``); raise ValueError with a user-facing message."""
    if is_data_url(value, inline):
        data = decode_data_url(value, inline)
        if not data:
            raise ValueError("the data URL holds no bytes")
        fmt = sniff_image_format(data)
        if fmt is None:
            raise ValueError(
                "the data URL's bytes are not an accepted image format "
                f"({', '.join(f.upper() for f in ACCEPTED_FORMATS)})"
            )
        return ImageRef(data=data, format=fmt)
    if _RAW_BASE64_RE.fullmatch(value[:_RAW_BASE64_PROBE]):
        raise ValueError(
            "this looks like raw base64 image data; send it as a data URL: "
            "data:image/jpeg;base64,<data> (image/png for a PNG, and so on)"
        )
    if len(value) > MAX_IMAGE_URL_CHARS:
        raise ValueError(f"an image URL may be at most {MAX_IMAGE_URL_CHARS} characters")
    if not value.lower().startswith(("http:", "https:")):
        raise ValueError("each image must be an http(s) URL or a base64 data URL")
    # The parser the worker's fetch uses: whatever submit accepts, the worker can fetch.
    try:
        parse_target(value, max_length=MAX_IMAGE_URL_CHARS)
    except TargetRefused as exc:
        raise ValueError(f"not a valid URL: it {exc.detail}") from None
    return ImageRef(url=value)


def parse_size(value: str) -> tuple[int, int]:
    """Every refusal names the allowed sizes, so a client fixes ``size`` in one round."""
    allowed = f"size must be one of: {', '.join(ALLOWED_SIZES)}"
    match = _SIZE_RE.match(value)
    if not match:
        raise ValueError(f"size must have the form WIDTH*HEIGHT; {allowed}")
    width, height = int(match.group(1)), int(match.group(2))
    pixels = width * height
    if not MIN_PIXELS <= pixels <= MAX_PIXELS:
        raise ValueError(
            f"size {value} has {pixels} pixels, outside {MIN_PIXELS} to {MAX_PIXELS}; {allowed}"
        )
    if not 1 / MAX_ASPECT <= width / height <= MAX_ASPECT:
        raise ValueError(f"size {value} has an aspect ratio outside 1/16 to 16; {allowed}")
    if value not in ALLOWED_SIZES:
        raise ValueError(f"size {value} is not offered; {allowed}")
    return width, height


class EditRequest(BaseModel):
    """The image-edit request body, ``webhook_url`` included (it is never passed to an engine)."""

    model_config = ConfigDict(extra="forbid", strict=True, str_strip_whitespace=False)

    model: StrictStr
    prompt: StrictStr = Field(min_length=1, max_length=MAX_PROMPT_CHARS)
    images: list[StrictStr] = Field(
        min_length=1, max_length=MAX_IMAGES, json_schema_extra=IMAGE_ITEMS_SCHEMA
    )
    # The schema lists the sizes (a form offers them as choices); the validator below
    # still answers a wrong one with the reason and the whole list.
    size: StrictStr = Field(default="2048*2048", json_schema_extra={"enum": list(ALLOWED_SIZES)})
    output_format: Literal["jpeg", "png"] = "jpeg"
    thinking: Literal["enabled", "disabled"] = Field(
        default="enabled", description="How loosely the prompt is read (disabled: literally)."
    )
    prompt_optimization_mode: Literal["standard", "fast"] = Field(
        default="standard", description="Resampling quality (standard) or speed (fast)."
    )
    enable_base64_output: StrictBool = False
    webhook_url: StrictStr | None = None

    @field_validator("images")
    @classmethod
    def _images(cls, value: list[str], info: ValidationInfo) -> list[str]:
        return check_image_items(value, info)

    @field_validator("size")
    @classmethod
    def _size(cls, value: str) -> str:
        parse_size(value)
        return value

    @property
    def dimensions(self) -> tuple[int, int]:
        return parse_size(self.size)


# The built-in edit engine's reading modes: other models that take the edit request accept
# them (the contract has them) but do nothing with them, and their schema says so.
EDIT_ENGINE_MODES = ("thinking", "prompt_optimization_mode")


def mark_no_effect(schema: dict[str, Any]) -> None:
    """``json_schema_extra`` of a model that ignores ``EDIT_ENGINE_MODES``: the catalogue,
    the CLI and the console show them as having no effect rather than as choices."""
    properties = schema.get("properties", {})
    for name in EDIT_ENGINE_MODES:
        if name in properties:
            properties[name][NO_EFFECT] = True
            properties[name]["description"] = "Accepted for the contract; no effect on this model."


def check_image_items(value: list[str], info: ValidationInfo) -> list[str]:
    """The ``images`` rule shared by every model that takes input images."""
    errors: list[tuple[int, str]] = []
    refs: list[ImageRef] = []
    inline = inline_data(info.context)
    for index, item in enumerate(value):
        try:
            refs.append(parse_image_ref(item, inline))
        except ValueError as exc:
            errors.append((index, str(exc)))
    if errors:
        raise ImageItemsError(errors)
    # Hand the decoded images to the caller, so submission does not decode them again.
    if isinstance(info.context, dict):
        info.context[IMAGE_REFS] = refs
    return value


class ImageItemsError(ValueError):
    """Per-item failures of ``images``, so each is reported as ``images[i]``."""

    def __init__(self, items: list[tuple[int, str]]) -> None:
        super().__init__("; ".join(f"images[{i}]: {m}" for i, m in items))
        self.items = items
