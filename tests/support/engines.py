"""Stand-ins for model servers, registered through ``GENHOOK_EXTRA_ENGINES``.

They fake the outside world (a model backend) while every service path around them runs
for real: validation, storage, leases, outputs, billing, webhooks.
"""

from __future__ import annotations

import io
import os
import time
from typing import Any

from PIL import Image

from genhook.config import Settings
from genhook.engines.base import Engine, EngineJob, EngineOutput, EngineResult, ModelKind, ModelSpec
from genhook.engines.edit_request import EditRequest, parse_size
from genhook.engines.registry import Registry, edit_pricing
from genhook.errors import ErrorCode, TaskFailure


class FakeEditEngine:
    """Renders a solid image of the requested size whose colour is the mean of the inputs.

    Prompt words steer it: ``sleep=<seconds>`` waits (an engine that cannot stop early),
    ``wait=<seconds>`` waits but stops early when the task is given up, ``fail`` fails with
    INSTRUCTION_INVALID, ``crash`` raises an unexpected error, ``nsfw`` flags the output,
    ``steps=<n>`` splits the sleep into n steps and reports progress and a log line after each.
    """

    loads = 0

    def load(self) -> None:
        FakeEditEngine.loads += 1

    def run(self, job: EngineJob) -> EngineResult:
        prompt = str(job.params["prompt"])
        words = dict(word.split("=", 1) for word in prompt.split() if "=" in word)
        steps = int(words.get("steps", "1"))
        for step in range(1, steps + 1):
            time.sleep(float(words.get("sleep", "0")) / steps)
            if "steps" in words:
                job.report(progress=step / steps, log=f"step {step} of {steps}")
        if "wait" in words:
            # Stops early when the job is given up, as an engine that can should.
            job.stop.wait(float(words["wait"]))
            job.stop_if_asked()
        if "fail" in prompt.split():
            raise TaskFailure(ErrorCode.INSTRUCTION_INVALID, "the prompt asked to fail")
        if "crash" in prompt.split():
            raise RuntimeError("unexpected engine bug")
        width, height = parse_size(str(job.params["size"]))
        colours = []
        for data in job.images:
            with Image.open(io.BytesIO(data)) as img:
                colours.append(img.convert("RGB").resize((1, 1)).getpixel((0, 0)))
        mean = tuple(sum(c[i] for c in colours) // len(colours) for i in range(3))
        fmt = str(job.params["output_format"])
        buffer = io.BytesIO()
        Image.new("RGB", (width, height), mean).save(buffer, "JPEG" if fmt == "jpeg" else "PNG")
        info: dict[str, Any] = {"inputs": len(job.images), "pid": os.getpid()}
        return EngineResult(
            outputs=[
                EngineOutput(
                    data=buffer.getvalue(),
                    content_type=f"image/{fmt}",
                    nsfw="nsfw" in prompt.split(),
                )
            ],
            info=info,
        )


def _fake(settings: Settings) -> Engine:
    return FakeEditEngine()


FAKE_EDIT = ModelSpec(
    id="test/fake-edit",
    kind=ModelKind.IMAGE,
    request_schema=EditRequest,
    engine_factory=_fake,
    pricing=edit_pricing,
    deadline_seconds=float(os.environ.get("GENHOOK_TEST_DEADLINE", "60")),
    accepted_on=frozenset({ModelKind.VIDEO}),
)
FAKE_AUDIO = ModelSpec(
    id="test/fake-audio",
    kind=ModelKind.AUDIO,
    request_schema=EditRequest,
    engine_factory=_fake,
    pricing=edit_pricing,
)


def register(registry: Registry) -> None:
    registry.register(FAKE_EDIT)
    registry.register(FAKE_AUDIO)
