"""The service's H.264 encoder settings, shared by the engines that write video
(image-to-video and the local video models)."""

from __future__ import annotations

from typing import Any

from genhook.config import Settings


def h264_stream(container: Any, fps: int, settings: Settings, x264_params: str = "") -> Any:
    """An H.264 stream on ``container`` with the service's encoder settings
    (GENHOOK_VIDEO_ENCODER_PRESET, GENHOOK_VIDEO_CRF, GENHOOK_VIDEO_ENCODER_THREADS)."""
    options = {
        "preset": settings.video_encoder_preset,
        "crf": str(settings.video_crf),
        "threads": str(settings.video_encoder_threads),
    }
    if x264_params:
        options["x264-params"] = x264_params
    return container.add_stream("libx264", rate=fps, options=options)
