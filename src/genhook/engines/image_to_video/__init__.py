"""The built-in video model (``genhook/image-to-video``): stills and a prompt in, an MP4 out.

This module stays light (no codec or OpenCV import), so the registry and the API process
can describe and price the model without loading the engine.
See ``docs/engines/image-to-video.md``.
"""

from __future__ import annotations

from decimal import Decimal
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

from genhook.engines.base import Charge, ModelKind, ModelSpec
from genhook.engines.style_names import style_choices
from genhook.engines.video_request import SHORT_SIDES, VideoRequest, frame_size

if TYPE_CHECKING:
    from genhook.config import Settings
    from genhook.engines.base import Engine

VIDEO_MODEL_ID = "genhook/image-to-video"


def video_price_per_second(settings: Settings, resolution: str) -> Decimal:
    prices = {
        "480p": settings.price_video_480p_per_second_usd,
        "720p": settings.price_video_720p_per_second_usd,
        "1080p": settings.price_video_1080p_per_second_usd,
    }
    return prices[resolution]


def video_pricing(settings: Settings, request: BaseModel) -> Charge:
    """Seconds of output times the resolution tier's price per second.

    ``output_pixels`` is one frame's; with no ``aspect_ratio`` (picked later from the first
    image) it is a 16:9 frame's, which no other ratio of the tier exceeds.
    """
    assert isinstance(request, VideoRequest)
    price = video_price_per_second(settings, request.resolution)
    width, height = frame_size(request.resolution, request.aspect_ratio or "16:9")
    seconds = request.duration
    line = (f"{seconds} s of {request.resolution} video at {price} USD/s", price * seconds)
    return Charge(
        tier=request.resolution,
        output_pixels=width * height,
        input_images=len(request.images),
        lines=(line,),
    )


def video_price_list(settings: Settings) -> dict[str, Any]:
    prices = {name: video_price_per_second(settings, name) for name in SHORT_SIDES}
    words = ", ".join(f"{price} USD at {name}" for name, price in prices.items())
    return {
        "summary": f"per second of output video: {words}",
        "unit": "second",
        "prices_usd": {name: str(price) for name, price in prices.items()},
    }


def _make_engine(settings: Settings) -> Engine:
    from genhook.engines.image_to_video._engine import ImageToVideoEngine

    return ImageToVideoEngine(settings)


def video_spec(settings: Settings) -> ModelSpec:
    return ModelSpec(
        id=VIDEO_MODEL_ID,
        kind=ModelKind.VIDEO,
        request_schema=VideoRequest,
        engine_factory=_make_engine,
        pricing=video_pricing,
        price_list=video_price_list,
        deadline_seconds=settings.video_deadline_seconds,
        description=(
            "Animates 1 to 10 images into an H.264 MP4 on the CPU: camera moves, fades and "
            "slideshow transitions read from the prompt, with the image-edit model's looks."
        ),
        choices=style_choices,
    )


__all__ = ["VIDEO_MODEL_ID", "VideoRequest", "video_pricing", "video_spec"]
