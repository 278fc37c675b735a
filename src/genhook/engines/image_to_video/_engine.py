"""``genhook/image-to-video``: stills and a prompt in, an H.264 MP4 out, on the CPU.

Order of work: prompt moderation, prompt -> motion plan and looks, decode inputs, NSFW check
of inputs, looks on each still, then frame by frame: camera view, transition, caption and
border, fade, encode. Frames are made and encoded one at a time, so memory does not grow
with the duration.
"""

from __future__ import annotations

import logging
import math
import os
import tempfile
import time
from dataclasses import dataclass
from typing import Any

import av
import numpy as np
from PIL import Image

from genhook.engines.base import EngineJob, EngineOutput, EngineResult
from genhook.engines.image_edit import (
    Decor,
    EditContext,
    EditingEngine,
    EditPlan,
    Looks,
    apply_looks,
    build_decor,
    read_looks,
)
from genhook.engines.image_to_video._camera import HEADROOM, Camera
from genhook.engines.image_to_video._motion import MotionPlan, parse_motion
from genhook.engines.image_to_video._yuv import I420, FrameDecor, fade, mix, render
from genhook.engines.media.decode import DecodedImage, check_pixel_budget, decode_image
from genhook.engines.media.moderation import check_prompt
from genhook.engines.media.nsfw import moderate_inputs
from genhook.engines.media.video import h264_stream
from genhook.engines.video_request import VideoRequest, frame_size, nearest_aspect_ratio
from genhook.errors import ErrorCode, TaskFailure

log = logging.getLogger(__name__)

DEFAULT_TRANSITION = "crossfade"
MAX_TRANSITION_SECONDS = 1.0
MAX_FADE_SECONDS = 1.0
NSFW_SAMPLE_RESOLUTION = 320


@dataclass(frozen=True, slots=True)
class Timeline:
    """Which stills a frame shows: one segment per still, transitions at the boundaries."""

    count: int
    seconds: float
    transition: str
    overlap: float  # seconds each transition lasts (0 for cuts)

    @property
    def segment(self) -> float:
        return self.seconds / self.count

    def at(self, t: float) -> tuple[int, int | None, float]:
        """(still, next still or None, mix of the next) at time ``t``."""
        index = min(self.count - 1, int(t / self.segment))
        if self.overlap > 0:
            boundary = (index + 1) * self.segment
            if index + 1 < self.count and t >= boundary - self.overlap / 2:
                return index, index + 1, (t - (boundary - self.overlap / 2)) / self.overlap
            start = index * self.segment
            if index > 0 and t < start + self.overlap / 2:
                return index - 1, index, (t - (start - self.overlap / 2)) / self.overlap
        return index, None, 0.0

    def progress(self, index: int, t: float) -> float:
        """How far still ``index``'s own move has gone at time ``t``, 0 to 1."""
        start = index * self.segment - (self.overlap / 2 if index > 0 else 0.0)
        end = (index + 1) * self.segment + (self.overlap / 2 if index + 1 < self.count else 0.0)
        return min(1.0, max(0.0, (t - start) / (end - start)))


class ImageToVideoEngine(EditingEngine):
    """Animates stills on the CPU; see ``docs/engines/image-to-video.md``."""

    kind = "video"

    def _run(self, job: EngineJob) -> EngineResult:
        request = job.request_as(VideoRequest)
        prompt = request.prompt
        duration = request.duration
        fps = request.fps
        resolution = request.resolution
        if not job.images:
            raise TaskFailure(ErrorCode.INSTRUCTION_INVALID, "the task has no input image")

        check_prompt(prompt, self._terms)
        motion = parse_motion(prompt)
        looks = read_looks(motion.rest, len(job.images))

        check_pixel_budget(job.images, self._settings.max_task_input_pixels)
        # Decode no larger than the widest frame of this resolution needs, whatever the ratio.
        limit = math.ceil(max(frame_size(resolution, "16:9")) * HEADROOM)

        def decode(number: int) -> DecodedImage:
            decoded = decode_image(
                job.images[number - 1],
                number,
                max_pixels=self._settings.max_input_pixels,
                reduce_to=limit,
            )
            if self._settings.moderation_reject_nsfw_inputs:
                moderate_inputs(self.detector, [decoded], self._settings.nsfw_threshold, number)
            return decoded

        first = decode(1)
        aspect: str | None = request.aspect_ratio
        aspect_why = "asked for"
        if aspect is None:
            aspect = nearest_aspect_ratio(first.image.width, first.image.height)
            aspect_why = "nearest to the first image"
        size = frame_size(resolution, str(aspect))

        notes: list[str] = list(motion.notes)
        if not motion.camera_moves:
            motion.default_motion = True
            notes.append(
                "the prompt names no camera move, so a gentle default motion (a slow 10% zoom "
                "in) was used"
            )
        if looks.unused:
            notes.append(
                "combinations ("
                + ", ".join(s.op.replace("_", " ") for s in looks.unused)
                + ") do not apply to video; several images play one after another"
            )
        decor = build_decor(looks.finishing, size)
        ctx = self.context(decor.inner, fast=False)
        # An input named as a style ("in the style of the second image") lends its look and
        # is not played.
        sources = looks.plan.style_sources if looks.plan is not None else frozenset()
        for index in sorted(sources):
            ctx.style_images[index] = (first if index == 0 else decode(index + 1)).image
        playing = [i for i in range(len(job.images)) if i not in sources]
        if not playing:
            raise TaskFailure(
                ErrorCode.INSTRUCTION_INVALID,
                "every input image is a style image; add the picture to animate",
            )
        # One decoded input at a time: only the stills, a fraction of the inputs' size, stay.
        stills: list[I420] = []
        for index in playing:
            decoded = first if index == 0 else decode(index + 1)
            stills.append(_still(decoded, looks, index, ctx, decor.inner, looks.plan))
        del first, decoded
        notes.extend(ctx.notes)

        transition = motion.transition or (DEFAULT_TRANSITION if len(stills) > 1 else "cut")
        if len(stills) > 1 and motion.transition is None:
            notes.append("no transition was named, so the images crossfade")
        if len(stills) == 1 and motion.transition is not None:
            notes.append(f"a {motion.transition} transition needs two or more images; unused")
        segment = duration / len(stills)
        overlap = 0.0 if transition == "cut" else min(MAX_TRANSITION_SECONDS, 0.3 * segment)
        timeline = Timeline(len(stills), float(duration), transition, overlap)

        job.report(progress=0.1, log=f"prepared {len(stills)} still(s) for {size[0]}*{size[1]}")
        started = time.perf_counter()
        data, samples = self._encode(stills, motion, timeline, decor, size, fps, duration, job)
        elapsed = time.perf_counter() - started
        job.report(progress=1.0, log=f"encoded the MP4, {len(data)} bytes")
        del stills
        nsfw_score = max(
            self.detector.detect(sample, NSFW_SAMPLE_RESOLUTION).nsfw_score for sample in samples
        )
        nsfw = nsfw_score >= self._settings.nsfw_threshold
        frames = duration * fps
        info: dict[str, Any] = {
            "plan": [move.describe() for move in motion.moves] + looks.describe(),
            "motion": _motion_summary(motion),
            "transition": transition if timeline.count > 1 else None,
            "duration": duration,
            "fps": fps,
            "frames": frames,
            "resolution": resolution,
            "size": f"{size[0]}*{size[1]}",
            "aspect_ratio": {"value": aspect, "why": aspect_why},
            "codec": "h264",
            "encode_seconds": round(elapsed, 3),
            "nsfw_score": round(nsfw_score, 4),
            "nsfw_frames_checked": len(samples),
        }
        if looks.plan is not None and looks.plan.interpretations:
            info["interpretations"] = looks.plan.interpretations
        if looks.ignored:
            info["ignored"] = looks.ignored
        if notes:
            info["notes"] = notes
        return EngineResult(
            outputs=[EngineOutput(data=data, content_type="video/mp4", nsfw=nsfw)], info=info
        )

    def _encode(
        self,
        stills: list[I420],
        motion: MotionPlan,
        timeline: Timeline,
        decor: Decor,
        size: tuple[int, int],
        fps: int,
        duration: int,
        job: EngineJob,
    ) -> tuple[bytes, list[Image.Image]]:
        """Make and encode the frames one at a time into an MP4 with the index up front;
        progress is reported after each second of video."""
        deadline = job.deadline
        inner = decor.inner
        overlay = FrameDecor(decor)
        camera = Camera(motion, stills[0].size, timeline.segment + timeline.overlap)
        frames = duration * fps
        fade_seconds = min(MAX_FADE_SECONDS, duration * 0.2)
        # One sample per still, at the middle of its segment, for the NSFW flag.
        sample_at = {
            min(frames - 1, int((i + 0.5) * timeline.segment * fps)) for i in range(len(stills))
        }
        samples: list[Image.Image] = []
        settings = self._settings
        with tempfile.TemporaryDirectory(prefix="genhook-video-") as workdir:
            path = os.path.join(workdir, "out.mp4")
            container = av.open(path, "w", format="mp4", options={"movflags": "+faststart"})
            try:
                # OpenCV's I420 is BT.601 limited range; say so, so players agree.
                stream = h264_stream(
                    container,
                    fps,
                    settings,
                    "colorprim=smpte170m:transfer=smpte170m:colormatrix=smpte170m:range=tv",
                )
                stream.width, stream.height = size
                stream.pix_fmt = "yuv420p"
                for number in range(frames):
                    if deadline is not None and time.time() >= deadline:
                        # The worker ends the task `timeout`; stop spending the CPU on it.
                        raise TaskFailure(
                            ErrorCode.TIMEOUT,
                            f"the video was not finished by its deadline ({number} of "
                            f"{frames} frames made)",
                        )
                    t = (number + 0.5) / fps
                    index, following, share = timeline.at(t)
                    picture = render(stills[index], camera.view(timeline.progress(index, t)), inner)
                    if following is not None:
                        other = render(
                            stills[following],
                            camera.view(timeline.progress(following, t)),
                            inner,
                        )
                        picture = mix(picture, other, share, timeline.transition)
                    frame = overlay.apply(picture)
                    level = 1.0
                    if motion.fade_in and t < fade_seconds:
                        level = min(level, t / fade_seconds)
                    if motion.fade_out and duration - t < fade_seconds:
                        level = min(level, (duration - t) / fade_seconds)
                    if level < 1.0:
                        frame = fade(frame, level)
                    if number in sample_at:
                        samples.append(_sample(frame))
                    video_frame = av.VideoFrame.from_ndarray(frame.buf, format="yuv420p")
                    video_frame.pts = number
                    container.mux(stream.encode(video_frame))
                    if (number + 1) % fps == 0:
                        job.report(
                            progress=0.1 + 0.85 * (number + 1) / frames,
                            log=f"encoded {number + 1} of {frames} frames",
                        )
                container.mux(stream.encode(None))
            finally:
                container.close()
            with open(path, "rb") as handle:
                return handle.read(), samples


def _still(
    decoded: DecodedImage,
    looks: Looks,
    index: int,
    ctx: EditContext,
    inner: tuple[int, int],
    plan: EditPlan | None,
) -> I420:
    """One input with its looks, filling ``inner`` times the headroom (cover, unless the
    prompt asked to fit it whole), in the encoder's own format."""
    from genhook.engines.media import FitMode
    from genhook.engines.media.output import fit, flatten

    image = apply_looks(looks, decoded.image, index, ctx)
    image = flatten(image, (0, 0, 0)) if image.mode == "RGBA" else image.convert("RGB")
    target = (2 * round(inner[0] * HEADROOM / 2), 2 * round(inner[1] * HEADROOM / 2))
    mode: FitMode = "cover"
    pad = "#000000"
    if plan is not None and plan.fit.mode != "auto":
        mode, pad = plan.fit.mode, plan.fit.pad_color
    fitted = fit(image, target, mode, pad, False)
    return I420.from_rgb(np.ascontiguousarray(np.asarray(fitted.convert("RGB"), np.uint8)))


def _sample(frame: I420) -> Image.Image:
    image = Image.fromarray(frame.to_rgb())
    image.thumbnail((NSFW_SAMPLE_RESOLUTION, NSFW_SAMPLE_RESOLUTION))
    return image


def _motion_summary(motion: MotionPlan) -> str:
    bits: list[str] = []
    if motion.default_motion:
        bits.append("gentle zoom in (default)")
    if motion.zoom:
        bits.append(f"zoom {motion.zoom}")
    if motion.pan_x:
        bits.append("pan " + ("left" if motion.pan_x < 0 else "right"))
    if motion.pan_y:
        bits.append("pan " + ("up" if motion.pan_y < 0 else "down"))
    if motion.rotate_degrees:
        sense = "clockwise" if motion.rotate_degrees > 0 else "counterclockwise"
        bits.append(f"rotate {abs(motion.rotate_degrees):g} degrees {sense}")
    if motion.shake:
        bits.append("shake")
    if motion.fade_in:
        bits.append("fade in")
    if motion.fade_out:
        bits.append("fade out")
    return ", ".join(bits)


__all__ = ["ImageToVideoEngine"]
