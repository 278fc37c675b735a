"""The wire schema of the ``genhook/image-to-video`` request (a generateVideo body).

Validation failures surface as HTTP 400 naming the field, exactly as for the edit request;
``images`` follows the edit request's rule item for item.
"""

from __future__ import annotations

import math
from typing import Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictInt,
    StrictStr,
    ValidationInfo,
    field_validator,
)

from genhook.engines.edit_request import (
    IMAGE_ITEMS_SCHEMA,
    MAX_IMAGES,
    MAX_PROMPT_CHARS,
    check_image_items,
)

Resolution = Literal["480p", "720p", "1080p"]
AspectRatio = Literal["16:9", "9:16", "1:1", "4:3", "3:4"]

MIN_DURATION = 1
MAX_DURATION = 30
SHORT_SIDES: dict[str, int] = {"480p": 480, "720p": 720, "1080p": 1080}
ASPECT_RATIOS: dict[str, tuple[int, int]] = {
    "16:9": (16, 9),
    "9:16": (9, 16),
    "1:1": (1, 1),
    "4:3": (4, 3),
    "3:4": (3, 4),
}


def frame_size(resolution: str, aspect_ratio: str) -> tuple[int, int]:
    """Width and height: the short side is the resolution's, both even (yuv420p needs it)."""
    short = SHORT_SIDES[resolution]
    across, down = ASPECT_RATIOS[aspect_ratio]
    long = 2 * round(short * max(across, down) / min(across, down) / 2)
    return (long, short) if across >= down else (short, long)


def nearest_aspect_ratio(width: int, height: int) -> str:
    """The offered ratio closest to a picture's own (compared in log space, so 2:1 and 1:2
    are as far from 1:1)."""

    own = math.log(width / height)
    return min(ASPECT_RATIOS, key=lambda name: abs(math.log(_ratio(name)) - own))


def _ratio(name: str) -> float:
    across, down = ASPECT_RATIOS[name]
    return across / down


class VideoRequest(BaseModel):
    """A generateVideo body for ``genhook/image-to-video``; see docs/engines/image-to-video.md."""

    model_config = ConfigDict(extra="forbid", strict=True, str_strip_whitespace=False)

    model: StrictStr
    prompt: StrictStr = Field(min_length=1, max_length=MAX_PROMPT_CHARS)
    images: list[StrictStr] = Field(
        min_length=1, max_length=MAX_IMAGES, json_schema_extra=IMAGE_ITEMS_SCHEMA
    )
    duration: StrictInt = Field(default=5, ge=MIN_DURATION, le=MAX_DURATION)
    resolution: Resolution = "720p"
    aspect_ratio: AspectRatio | None = None
    fps: Literal[24, 30] = 30
    enable_base64_output: StrictBool = False
    webhook_url: StrictStr | None = None

    @field_validator("images")
    @classmethod
    def _images(cls, value: list[str], info: ValidationInfo) -> list[str]:
        return check_image_items(value, info)
