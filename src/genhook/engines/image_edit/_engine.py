"""``genhook/image-edit``: the built-in engine behind the image-edit request.

Order of work for one task: prompt moderation, prompt -> plan, decode inputs, NSFW check
of inputs, per-image steps, combination, whole-picture steps, fit to the requested size,
border and caption, NSFW flag of the output, encode.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import Any

from PIL import Image

from genhook.engines.base import EngineJob, EngineOutput, EngineResult
from genhook.engines.edit_request import EditRequest
from genhook.engines.image_edit import _compose, _ops
from genhook.engines.image_edit._parser import parse_prompt
from genhook.engines.image_edit._plan import COMBINE_OPS, FINISHING_OPS, EditPlan, Step
from genhook.engines.image_edit._style import Stylizer
from genhook.engines.media import FitMode
from genhook.engines.media import output as _output
from genhook.engines.media.decode import (
    DecodedImage,
    check_pixel_budget,
    decode_image,
)
from genhook.engines.media.moderation import check_prompt
from genhook.engines.media.nsfw import DetectorEngine, moderate_inputs
from genhook.engines.onnx import shared_threads
from genhook.errors import ErrorCode, TaskFailure
from genhook.media import DecodeLimits

log = logging.getLogger(__name__)

_CONTAIN_OPS = frozenset({"crop", "side_by_side", "stack_vertical", "grid"})


class EditingEngine(DetectorEngine):
    """A picture engine that applies the edit vocabulary's operations (the image-edit engine,
    and image-to-video's looks): the detector's shell plus the style networks."""

    @property
    def stylizer(self) -> Stylizer:
        """The style networks of this process; each is loaded when first asked for."""
        return Stylizer.shared(shared_threads(self._settings))

    def context(self, out_size: tuple[int, int], fast: bool) -> _ops.Context:
        return _ops.Context(
            out_size=out_size, fast=fast, detector=self.detector, stylizer=self.stylizer
        )


class ImageEditEngine(EditingEngine):
    """Instruction-driven edits on the CPU; see ``docs/engines/image-edit.md``."""

    def _run(self, job: EngineJob) -> EngineResult:
        request = job.request_as(EditRequest)
        prompt = request.prompt
        try:
            out_size = request.dimensions
        except ValueError as exc:
            raise TaskFailure(ErrorCode.INSTRUCTION_INVALID, str(exc)) from None
        output_format = request.output_format
        if output_format not in ("jpeg", "png"):
            raise TaskFailure(
                ErrorCode.INSTRUCTION_INVALID, "output_format must be 'jpeg' or 'png'"
            )
        thinking = request.thinking
        fast = request.prompt_optimization_mode == "fast"
        if not job.images:
            raise TaskFailure(ErrorCode.INSTRUCTION_INVALID, "the task has no input image")

        check_prompt(prompt, self._terms)
        plan = parse_prompt(prompt, len(job.images), loose=thinking == "enabled")
        log.info("task %s plan: %s", job.task_id, plan.summary())
        job.report(progress=0.05, log=f"plan: {plan.summary()}")

        limit = max(out_size)
        check_pixel_budget(job.images, self._settings.max_task_input_pixels)
        decoded = [
            decode_image(
                data,
                number,
                max_pixels=self._settings.max_input_pixels,
                reduce_to=limit,
                limits=DecodeLimits(
                    self._settings.max_input_pixels,
                    max_scans=self._settings.max_decode_scans,
                    max_chunks=self._settings.max_decode_chunks,
                ),
            )
            for number, data in enumerate(job.images, start=1)
        ]
        job.report(progress=0.25, log=f"decoded {len(decoded)} input image(s)")
        job.stop_if_asked()
        if self._settings.moderation_reject_nsfw_inputs:
            self._moderate_inputs(decoded)
            job.report(progress=0.35, log="inputs passed moderation")

        job.stop_if_asked()
        ctx = self.context(out_size, fast)
        images = [_cap(d.image, limit, ctx.fast) for d in decoded]
        # The plan as the user numbered the inputs stays for ``info``; this one runs.
        work = plan
        if plan.style_sources:
            images, work = _lend_styles(plan, images, ctx)
        canvas, finishing, summary_extra = self._execute(work, images, ctx, limit)
        job.report(progress=0.7, log="edits applied")
        job.stop_if_asked()

        fit_mode, why = _choose_fit(work, len(images))
        final = self._finish(canvas, finishing, out_size, fit_mode, work.fit.pad_color, ctx)
        if final.size != out_size:  # pragma: no cover - a broken invariant, not a user error
            raise TaskFailure(ErrorCode.ENGINE_ERROR, f"output is {final.size}, not {out_size}")

        job.report(progress=0.8, log=f"fitted to {out_size[0]}*{out_size[1]} ({fit_mode})")
        nsfw_score = self.detector.detect(final, 320).nsfw_score
        nsfw = nsfw_score >= self._settings.nsfw_threshold
        data, content_type = _output.encode(final, output_format, fast)
        job.report(progress=1.0, log=f"encoded {output_format}, {len(data)} bytes")

        info: dict[str, Any] = {
            "plan": plan.describe(),
            "summary": ", then ".join([*summary_extra, plan.summary()]),
            "fit": {"policy": fit_mode, "why": why, "pad_color": plan.fit.pad_color},
            "size": f"{out_size[0]}*{out_size[1]}",
            "output_format": output_format,
            "thinking": thinking,
            "prompt_optimization_mode": request.prompt_optimization_mode,
            "resampling": "bilinear" if fast else "bicubic up, pixel-area down",
            "inputs": [
                {
                    "image": number,
                    "format": d.format,
                    "width": d.width,
                    "height": d.height,
                    **({"animated": True, "frame_used": 1} if d.animated else {}),
                }
                for number, d in enumerate(decoded, start=1)
            ],
            "nsfw_score": round(nsfw_score, 4),
        }
        if plan.interpretations:
            info["interpretations"] = plan.interpretations
        if plan.ignored:
            info["ignored"] = plan.ignored
        if any(s.op in ("blur_faces", "pixelate_faces") for s in plan.steps):
            info["faces_detected"] = ctx.faces_found
        if ctx.notes:
            info["notes"] = ctx.notes
        if output_format == "jpeg" and final.mode == "RGBA":
            info.setdefault("notes", []).append(
                "JPEG has no transparency: transparent areas were flattened onto white"
            )
        return EngineResult(
            outputs=[EngineOutput(data=data, content_type=content_type, nsfw=nsfw)], info=info
        )

    def _moderate_inputs(self, decoded: list[DecodedImage]) -> None:
        moderate_inputs(self.detector, decoded, self._settings.nsfw_threshold)

    def _execute(
        self, plan: EditPlan, images: list[Image.Image], ctx: _ops.Context, limit: int
    ) -> tuple[Image.Image, list[Step], list[str]]:
        """Run every step but the final finishing ones; return (canvas, finishing, notes)."""
        single = len(images) == 1
        steps = list(plan.steps)
        extra: list[str] = []
        if not single and plan.combine is None:
            default = "side_by_side" if len(images) <= 3 else "grid"
            steps.insert(0, Step(default, {}, (), "(default for several images)"))
            extra.append(f"{default.replace('_', ' ')} (default for several images)")
            ctx.notes.append(
                f"no combination was named, so the {len(images)} images were combined "
                f"{default.replace('_', ' ')}"
            )

        # Steps naming images run on those inputs before any combination, in prompt order.
        if not single:
            for step in steps:
                if step.targets and step.op not in COMBINE_OPS:
                    for index in step.targets:
                        images[index] = apply_to_input(step, images[index], ctx)
            steps = [s for s in steps if not s.targets or s.op in COMBINE_OPS]

        canvas: Image.Image | None = images[0] if single else None
        finishing: list[Step] = []
        for step in steps:
            if step.op in COMBINE_OPS:
                canvas, used = _compose.combine(step, images, limit, ctx.fast)
                canvas = _cap(canvas, limit, ctx.fast)
                unused = [i + 1 for i in range(len(images)) if i not in used]
                if unused:
                    ctx.notes.append(
                        f"image{'s' if len(unused) > 1 else ''} "
                        f"{', '.join(map(str, unused))} not used by {step.op.replace('_', ' ')}"
                    )
            elif canvas is None:
                images = [apply_to_input(step, image, ctx) for image in images]
            elif step.op in FINISHING_OPS:
                finishing.append(step)
            else:
                canvas = _ops.apply(step, canvas, ctx)
                canvas = _cap(canvas, limit, ctx.fast)
        assert canvas is not None
        return canvas, finishing, extra

    def _finish(
        self,
        canvas: Image.Image,
        finishing: list[Step],
        out_size: tuple[int, int],
        fit_mode: FitMode,
        pad_color: str,
        ctx: _ops.Context,
    ) -> Image.Image:
        borders = [
            (_output.border_width(s.params, out_size), str(s.params["color"]))
            for s in finishing
            if s.op == "border"
        ]
        total = sum(width for width, _ in borders)
        inner = (max(16, out_size[0] - 2 * total), max(16, out_size[1] - 2 * total))
        total = (out_size[0] - inner[0]) // 2
        content = _output.fit(canvas, inner, fit_mode, pad_color, ctx.fast)
        for step in finishing:
            if step.op == "caption":
                content = _output.caption(content, step.params)
        for width, color in borders:
            width = min(width, total)
            if width <= 0:
                continue
            content = _output.surround(content, width, color)
            total -= width
        if content.size != out_size:
            content = _output.fit(content, out_size, "stretch", pad_color, ctx.fast)
        return content


def apply_to_input(step: Step, image: Image.Image, ctx: _ops.Context) -> Image.Image:
    if step.op == "border":
        width = _output.border_width(step.params, image.size, ctx.px(image, 1.0))
        return _output.add_border(image, width, str(step.params["color"]))
    if step.op == "caption":
        return _output.caption(image, step.params)
    return _ops.apply(step, image, ctx)


def _lend_styles(
    plan: EditPlan, images: list[Image.Image], ctx: _ops.Context
) -> tuple[list[Image.Image], EditPlan]:
    """Set aside the inputs that only lend their style, and renumber what the plan's steps
    name among the others; a step that named only style inputs has nothing left to do."""
    sources = plan.style_sources
    kept = [i for i in range(len(images)) if i not in sources]
    if not kept:
        raise TaskFailure(
            ErrorCode.INSTRUCTION_INVALID,
            "every input image is a style image; add the picture to restyle",
        )
    ctx.style_images = {i: images[i] for i in sources}
    number = {old: new for new, old in enumerate(kept)}
    steps: list[Step] = []
    for step in plan.steps:
        targets = tuple(number[t] for t in step.targets if t in number)
        if step.targets and not targets:
            ctx.notes.append(f"{step.clause!r} names only a style image; it was not applied")
            continue
        steps.append(replace(step, targets=targets))
    return [images[i] for i in kept], replace(plan, steps=steps)


def _cap(image: Image.Image, limit: int, fast: bool) -> Image.Image:
    """Work at no more than the output's long side: more pixels cost time, add nothing."""
    if max(image.size) <= limit:
        return image
    scale = limit / max(image.size)
    size = (max(1, round(image.width * scale)), max(1, round(image.height * scale)))
    return _output.resize(image, size, fast)


def _choose_fit(plan: EditPlan, image_count: int) -> tuple[FitMode, str]:
    if plan.fit.mode != "auto":
        return plan.fit.mode, "asked for in the prompt"
    framing = {s.op for s in plan.steps} & _CONTAIN_OPS
    if image_count > 1 and plan.combine is None:
        framing.add("default combination")
    if framing:
        return (
            "contain",
            f"the plan sets its own framing ({', '.join(sorted(framing))}), so nothing is cut",
        )
    return "cover", "default: scale to fill the requested size and crop the overflow evenly"
