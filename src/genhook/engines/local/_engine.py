"""The diffusers engine: one local model's pipeline behind genhook's contract.

``generate`` takes a list of jobs that share one call shape (size, steps, guidance) and makes
ONE pipeline call for all of them, each with its own seeded ``torch.Generator``; ``run`` calls
it with one job. The per-picture work around the call (decoding and moderating the inputs,
scaling, checking and encoding the outputs) is not batched by the model, so for a batch it
runs on the process's cores, one picture per thread. The call itself runs in the worker's
model process (``_host.py``): after every denoising step it reports progress, and it stops
after the step during which every job was given up (cancel, lost lease, shutdown) or passed
its deadline, so the device is free within one step and the worker stays in service.
"""

from __future__ import annotations

import contextlib
import contextvars
import io
import logging
import os
import secrets
import tempfile
import threading
import time
from collections.abc import Callable, Hashable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np
from PIL import ExifTags, Image

from genhook.config import Settings
from genhook.engines.base import STOPPED_EARLY, EngineJob, EngineOutput, EngineResult
from genhook.engines.local import _host
from genhook.engines.local._config import LocalModel, lora_file
from genhook.engines.local._host import HOST, CallClock, ModelProcessExited, OutOfMemory, Stopped
from genhook.engines.local._lora_urls import LoraCache
from genhook.engines.local._residency import (
    Adapter,
    AdapterUnfit,
    DeviceUnavailable,
    ModelTooLarge,
)
from genhook.engines.local._spec import _SCHEMAS, output_dimensions, request_loras
from genhook.engines.media import output as _output
from genhook.engines.media.compose import side_by_side
from genhook.engines.media.decode import DecodedImage, decode_image
from genhook.engines.media.moderation import check_prompt
from genhook.engines.media.nsfw import DetectorEngine, moderate_inputs
from genhook.engines.onnx import shared_threads, usable_cores
from genhook.errors import ErrorCode, TaskFailure
from genhook.media import DecodeLimits, register_heif

log = logging.getLogger(__name__)
# The longest side an input is decoded at, and a composite of several inputs is made at:
# more than any pipeline takes (the picture is fitted to the generated size next), and it
# bounds what several inputs side by side can cost (engines/media/compose.py).
COMPOSITE_SIDE = 4096

_In = TypeVar("_In")
_Out = TypeVar("_Out")
_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


def _each(function: Callable[[_In], _Out], items: Sequence[_In]) -> list[_Out]:
    """``function`` over ``items``, in order: one item in the calling thread, several on the
    process's shared pool, as many at once as the process may use cores. Pillow, OpenCV and
    ONNX Runtime release the GIL, so a batch's pictures are checked and encoded side by side
    instead of one after another while the device waits. Each call sees the caller's context
    (the engine run's trace span)."""
    global _pool
    if len(items) < 2:
        return [function(item) for item in items]
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(usable_cores(), "genhook-pictures")
    futures = [_pool.submit(contextvars.copy_context().run, function, item) for item in items]
    return [future.result() for future in futures]


@contextlib.contextmanager
def _task_failures(jobs: Sequence[EngineJob] = ()) -> Iterator[None]:
    """A model process command's failures as the task's: out of memory (3020), the
    process's death (3021: the worker runs the task again once, on a fresh process), a
    device the worker lacks (3099), a call that stopped for its ``jobs`` (given up, or past
    the deadline: 3001)."""
    try:
        yield
    except (ModelTooLarge, OutOfMemory) as exc:
        raise TaskFailure(ErrorCode.ENGINE_OUT_OF_MEMORY, str(exc)) from None
    except ModelProcessExited as exc:
        raise TaskFailure(ErrorCode.MODEL_PROCESS_DIED, str(exc)) from None
    except DeviceUnavailable as exc:
        raise TaskFailure(ErrorCode.ENGINE_ERROR, str(exc)) from None
    except AdapterUnfit as exc:
        raise TaskFailure(ErrorCode.INSTRUCTION_INVALID, str(exc)) from None
    except Stopped:
        deadline = jobs[0].deadline if jobs and not jobs[0].stop.is_set() else None
        if deadline is not None and time.time() >= deadline:
            message = "the model did not finish by the deadline"
            raise TaskFailure(ErrorCode.TIMEOUT, message) from None
        raise TaskFailure(ErrorCode.ENGINE_ERROR, STOPPED_EARLY) from None


@dataclass(frozen=True, slots=True)
class _Prepared:
    """One job, decoded and moderated, ready for a shared pipeline call."""

    job: EngineJob
    request: Any
    prompt: str
    image: Image.Image | None
    seed: int
    size: tuple[int, int]
    # The LoRA adapters of the call, in the request's order, those of scale 0 left out.
    adapters: tuple[Adapter, ...] = ()


class DiffusersEngine(DetectorEngine):
    """A ``LocalModel``'s pipeline; its weights live in the worker's model process."""

    kind = "local model"

    def __init__(self, model: LocalModel, settings: Settings) -> None:
        super().__init__(settings)
        self.model = model
        self._threads = settings.local_models_cpu_threads or shared_threads(settings)
        self._device: str | None = None
        self._clock = CallClock()
        # Adapters by URL (when the operator allows them), fetched and kept on disk.
        self.lora_cache = LoraCache(settings) if settings.local_models_lora_urls else None

    def load(self) -> None:
        self.pipeline()
        super().load()

    def detector_threads(self) -> int:
        """On the CPU the pictures' NSFW checks take turns with the calls on the same cores,
        so they get the same share. Beside a GPU's calls they keep to one core (as measured
        on the card), leaving the model process's cores to it."""
        return self._threads if self._device == "cpu" else 1

    def pipeline(self) -> None:
        """Load the model in the model process, unless it is there already."""
        with _task_failures():
            self._device = HOST.run(_host.load, self.model, self._settings)

    def _run(self, job: EngineJob) -> EngineResult:
        (result,) = self.generate([job])
        return result

    def stuck(self, asked_at: float) -> bool:
        """A call stops at the end of its step: stuck once it has gone twice its model's
        slowest step without one, and a minute before its first (a load is never cut short)."""
        return self._clock.stuck(asked_at)

    def abort(self) -> None:
        """A stuck call (a hung kernel, a first step slower than the wait): end the model
        process, which frees the device; the next task starts another."""
        HOST.abort()

    def generate(self, jobs: Sequence[EngineJob]) -> list[EngineResult]:
        """One pipeline call for ``jobs`` (same size, steps and guidance), one result each."""
        return self._generate(_each(self._prepare, jobs))

    def batch_key(self, job: EngineJob) -> Hashable:
        """Jobs share a call when they share its shape: output size, steps and guidance
        (and a video's duration and frame rate) and the LoRA adapters with their scales, so
        a call never mixes adapters; prompts, images and seeds may differ."""
        request: Any = job.request_as(_SCHEMAS[self.model.family.task])
        steps = request.num_inference_steps or self.model.steps
        video: tuple[Any, ...] = ()
        first = None
        if self.model.family.task == "video":
            video = (request.duration, request.fps)
            if request.aspect_ratio is None and job.images:
                first = _oriented_size(job.images[0])
        shape = (output_dimensions(request, first), steps, request.guidance_scale, *video)
        return (*shape, self._adapter_key(request))

    def _adapter_key(self, request: Any) -> tuple[tuple[str, str, float], ...]:
        """A request's adapters as the call applies them: by name or URL, with the scale the
        call uses, those of scale 0 (no effect) left out."""
        key = []
        for choice in request_loras(request):
            scale = self._scale(choice)
            if scale != 0:
                source = ("name", choice.name) if choice.name else ("url", choice.url or "")
                key.append((*source, scale))
        return tuple(key)

    def _scale(self, choice: Any) -> float:
        if choice.scale is not None:
            return float(choice.scale)
        entry = self.model.loras.get(choice.name) if choice.name else None
        return entry.scale if entry is not None else 1.0

    def run_batch(self, jobs: Sequence[EngineJob]) -> list[EngineResult | TaskFailure]:
        """One pipeline call for the jobs that decode and pass moderation; a job that does
        not fails alone, before the call. A failure of the call itself (out of memory, say)
        raises, and the worker then runs each job alone."""
        entries: list[EngineResult | TaskFailure | _Prepared] = _each(self._prepare_alone, jobs)
        for index, item in enumerate(entries):  # given up while the others were prepared
            if isinstance(item, _Prepared) and item.job.stop.is_set():
                entries[index] = TaskFailure(ErrorCode.ENGINE_ERROR, STOPPED_EARLY)
        ready = [(index, item) for index, item in enumerate(entries) if isinstance(item, _Prepared)]
        if ready:
            results = self._generate([item for _, item in ready])
            for (index, _), result in zip(ready, results, strict=True):
                entries[index] = result
        return [entry for entry in entries if not isinstance(entry, _Prepared)]

    def _prepare_alone(self, job: EngineJob) -> _Prepared | TaskFailure:
        """A job that cannot be prepared fails alone, before the call."""
        try:
            job.stop_if_asked()
            return self._prepare(job)
        except TaskFailure as failure:
            return failure

    def _generate(self, prepared: list[_Prepared]) -> list[EngineResult]:
        first = prepared[0].request
        steps = first.num_inference_steps or self.model.steps
        guidance = first.guidance_scale
        guidance = self.model.guidance_scale if guidance is None else float(guidance)
        size = prepared[0].size
        for item in prepared[1:]:
            shape = (item.request.num_inference_steps or self.model.steps, item.size)
            if shape != (steps, size) or item.request.guidance_scale != first.guidance_scale:
                raise ValueError("jobs of one pipeline call must share size, steps and guidance")
            if item.adapters != prepared[0].adapters:
                raise ValueError("jobs of one pipeline call must share their LoRA adapters")
        generate = self.model.generate_dimensions(size)
        arguments = self._arguments(prepared, generate, steps, guidance)
        jobs = [item.job for item in prepared]
        for job in jobs:
            job.stop_if_asked()
            job.report(progress=0.05, log=f"generating with {self.model.pipeline}")

        def on_step(step: int) -> None:
            done = min(step + 1, steps)  # a second-order scheduler calls back twice a step
            for job in jobs:
                job.report(progress=0.05 + 0.85 * done / steps, log=f"step {done}/{steps}")

        def given_up() -> bool:
            return all(job.given_up() for job in jobs)

        seeds = [item.seed for item in prepared]
        with _task_failures(jobs):
            pictures, seconds = HOST.run(
                _host.generate,
                self.model,
                self._settings,
                arguments,
                seeds,
                self._threads,
                generate,
                prepared[0].adapters,
                on_step=on_step,
                stop=given_up,
                clock=self._clock,
            )
        info = {
            "pipeline": self.model.pipeline,
            "steps": steps,
            "guidance_scale": guidance,
            "generated_size": f"{generate[0]}*{generate[1]}",
            "size": f"{size[0]}*{size[1]}",
            "seconds": round(seconds, 3),
        }
        loras = [
            {"name": c.name, "scale": self._scale(c)}
            if c.name
            else {"url": c.url, "scale": self._scale(c)}
            for c in request_loras(first)
        ]
        if loras:
            info["loras"] = loras
        if self.model.family.task == "video":
            videos = [(item, np.asarray(pictures[index])) for index, item in enumerate(prepared)]
            return _each(lambda pair: self._video(*pair, info), videos)
        return _each(
            lambda pair: self._image(*pair, info), list(zip(prepared, pictures, strict=True))
        )

    def _prepare(self, job: EngineJob) -> _Prepared:
        task = self.model.family.task
        # The family's request (the model's own schema subclasses it): prompt, size, knobs.
        request: Any = job.request_as(_SCHEMAS[task])
        check_prompt(request.prompt, self._terms)
        image = None
        first = None
        if task != "text":
            if not job.images:
                raise TaskFailure(ErrorCode.INSTRUCTION_INVALID, "the task has no input image")
            decoded = [self._decode(data, number) for number, data in enumerate(job.images, 1)]
            if self._settings.moderation_reject_nsfw_inputs:
                moderate_inputs(self.detector, decoded, self._settings.nsfw_threshold)
            image = side_by_side([item.image for item in decoded], COMPOSITE_SIDE)
            first = decoded[0].image.size
        seed = request.seed if request.seed is not None else secrets.randbelow(2**32)
        size = output_dimensions(request, first)
        adapters = self._adapters(request)
        return _Prepared(job, request, request.prompt, image, seed, size, adapters)

    def _adapters(self, request: Any) -> tuple[Adapter, ...]:
        """The request's adapters as files: an entry's (checked again: it may have changed
        since the start), or one fetched by URL into the cache."""
        adapters = []
        for choice in request_loras(request):
            scale = self._scale(choice)
            if scale == 0:
                continue
            if choice.name is not None:
                entry = self.model.loras.get(choice.name)
                if entry is None:  # the entry changed since the task was submitted
                    raise TaskFailure(
                        ErrorCode.INSTRUCTION_INVALID,
                        f"local model {self.model.id!r} has no LoRA adapter {choice.name!r}",
                    )
                try:
                    file = lora_file(entry.path)
                except ValueError as exc:
                    raise TaskFailure(
                        ErrorCode.ENGINE_ERROR,
                        f"local model {self.model.id!r}, LoRA {choice.name!r}: {exc}",
                    ) from None
                adapters.append(Adapter(f"entry_{choice.name}", file, scale))
            else:
                if self.lora_cache is None or choice.url is None:
                    raise TaskFailure(
                        ErrorCode.INSTRUCTION_INVALID,
                        "LoRA adapters by URL are not enabled on this service",
                    )
                file = self.lora_cache.file(choice.url)
                adapters.append(Adapter(f"url_{file.stem[:16]}", file, scale))
        return tuple(adapters)

    def _decode(self, data: bytes, number: int) -> DecodedImage:
        settings = self._settings
        return decode_image(
            data,
            number,
            max_pixels=settings.max_input_pixels,
            reduce_to=COMPOSITE_SIDE,
            limits=DecodeLimits(
                settings.max_input_pixels,
                max_scans=settings.max_decode_scans,
                max_chunks=settings.max_decode_chunks,
            ),
        )

    def _arguments(
        self, prepared: list[_Prepared], generate: tuple[int, int], steps: int, guidance: float
    ) -> dict[str, Any]:
        width, height = generate
        kwargs: dict[str, Any] = {
            "prompt": [item.prompt for item in prepared],
            "num_inference_steps": steps,
        }
        images = [
            _output.fit(i.image, generate, "cover", "white", False) for i in prepared if i.image
        ]
        pipeline = self.model.pipeline
        if pipeline == "StableDiffusionInstructPix2PixPipeline":
            kwargs.update(
                image=images,
                guidance_scale=guidance,
                image_guidance_scale=self.model.image_guidance_scale,
            )
        elif pipeline == "FluxKontextPipeline":
            kwargs.update(
                image=images,
                height=height,
                width=width,
                guidance_scale=guidance,
                max_area=width * height,
                _auto_resize=False,
            )
        elif pipeline == "QwenImageEditPipeline":
            kwargs.update(image=images, height=height, width=width, true_cfg_scale=guidance)
            if guidance > 1:
                # The pipeline guides only against a negative prompt: without one it ignores
                # true_cfg_scale. A blank one, as the model's own examples pass.
                kwargs["negative_prompt"] = [" "] * len(prepared)
        elif pipeline == "LTXImageToVideoPipeline":
            request = prepared[0].request
            kwargs.update(
                image=images,
                height=height,
                width=width,
                num_frames=self.model.frames,
                frame_rate=request.fps,
                guidance_scale=guidance,
                output_type="np",
            )
        else:  # text to image
            kwargs.update(height=height, width=width, guidance_scale=guidance)
        return kwargs

    def _image(self, item: _Prepared, picture: Image.Image, info: dict[str, Any]) -> EngineResult:
        request = item.request
        final = _output.fit(picture.convert("RGB"), item.size, "cover", "white", False)
        score = self.detector.detect(final, 320).nsfw_score
        data, content_type = _output.encode(final, request.output_format, False)
        item.job.report(progress=1.0, log=f"encoded {request.output_format}, {len(data)} bytes")
        nsfw = score >= self._settings.nsfw_threshold
        details = {**info, "seed": item.seed, "nsfw_score": round(score, 4)}
        return EngineResult([EngineOutput(data, content_type, nsfw)], info=details)

    def _video(self, item: _Prepared, frames: np.ndarray, info: dict[str, Any]) -> EngineResult:
        request = item.request
        count = request.duration * request.fps
        pictures = [Image.fromarray(_to_uint8(frame)) for frame in frames]
        middle = _output.fit(pictures[len(pictures) // 2], item.size, "cover", "white", False)
        score = self.detector.detect(middle, 320).nsfw_score
        data = encode_mp4(pictures, item.size, request.fps, count, self._settings)
        item.job.report(progress=1.0, log=f"encoded {count} frames, {len(data)} bytes")
        nsfw = score >= self._settings.nsfw_threshold
        details = {
            **info,
            "seed": item.seed,
            "frames_generated": len(pictures),
            "frames": count,
            "fps": request.fps,
            "nsfw_score": round(score, 4),
        }
        return EngineResult([EngineOutput(data, "video/mp4", nsfw)], info=details)


def _oriented_size(data: bytes) -> tuple[int, int] | None:
    """A picture's width and height as decoding turns it (EXIF orientation), from its header
    alone; None when that cannot be read (the task then fails alone, in preparing)."""
    try:
        register_heif()
        with Image.open(io.BytesIO(data)) as image:
            width, height = image.size
            turned = image.getexif().get(ExifTags.Base.Orientation) in (5, 6, 7, 8)
    except Exception:  # any reader's error: the decode that follows names it
        return None
    return (height, width) if turned else (width, height)


def _to_uint8(frame: np.ndarray) -> np.ndarray:
    if frame.dtype == np.uint8:
        return frame
    scaled: np.ndarray = (np.clip(frame, 0.0, 1.0) * 255).round().astype(np.uint8)
    return scaled


def encode_mp4(
    pictures: list[Image.Image], size: tuple[int, int], fps: int, count: int, settings: Settings
) -> bytes:
    """H.264 at exactly ``size``: the generated frames spread evenly over ``count`` frames."""
    import av

    with tempfile.TemporaryDirectory(prefix="genhook-local-video-") as workdir:
        path = os.path.join(workdir, "out.mp4")
        _write_mp4(
            av.open(path, "w", format="mp4", options={"movflags": "+faststart"}),
            pictures,
            size,
            fps,
            count,
            settings,
        )
        with open(path, "rb") as handle:
            return handle.read()


def _write_mp4(
    container: Any,
    pictures: list[Image.Image],
    size: tuple[int, int],
    fps: int,
    count: int,
    settings: Settings,
) -> None:
    # PyAV only where a video is written: image models need not import it.
    import av

    from genhook.engines.media.video import h264_stream

    try:
        stream = h264_stream(container, fps, settings)
        stream.width, stream.height = size
        stream.pix_fmt = "yuv420p"
        scaled: dict[int, Any] = {}
        for number in range(count):
            source = min(len(pictures) - 1, number * len(pictures) // count)
            if source not in scaled:
                scaled.clear()
                fitted = _output.fit(pictures[source], size, "cover", "white", False)
                scaled[source] = np.asarray(fitted.convert("RGB"))
            frame = av.VideoFrame.from_ndarray(scaled[source], format="rgb24")
            frame.pts = number
            container.mux(stream.encode(frame))
        container.mux(stream.encode(None))
    finally:
        container.close()
