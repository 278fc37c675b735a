"""A trivial image engine for measuring the service around it (``benchmarks/e2e_latency.py``).

``bench/trivial`` decodes its input image (an ~8 KB PNG in the benchmark), converts it to
grayscale, resizes it to 1024x1024 and encodes a JPEG: a few milliseconds of real work, so
the figures show the service's own cost. Register it with
``GENHOOK_EXTRA_ENGINES='["benchmarks.trivial_engine:register"]'`` (the repository root on
``PYTHONPATH``). The engine's own time is returned in ``info.engine_ms``.
"""

from __future__ import annotations

import io
import time

from genhook.config import Settings
from genhook.engines.base import Engine, EngineJob, EngineOutput, EngineResult, ModelKind, ModelSpec
from genhook.engines.edit_request import EditRequest
from genhook.engines.registry import Registry, edit_pricing

MODEL = "bench/trivial"


class TrivialEngine:
    def load(self) -> None:
        from PIL import Image

        Image.init()  # the codecs, before the first task

    def run(self, job: EngineJob) -> EngineResult:
        from PIL import Image

        started = time.thread_time()
        with Image.open(io.BytesIO(job.images[0])) as image:
            gray = image.convert("L").resize((1024, 1024), Image.Resampling.BILINEAR)
        buffer = io.BytesIO()
        gray.save(buffer, "JPEG", quality=85)
        engine_ms = (time.thread_time() - started) * 1000
        return EngineResult(
            outputs=[EngineOutput(data=buffer.getvalue(), content_type="image/jpeg")],
            info={"engine_ms": round(engine_ms, 3)},
        )


def _engine(settings: Settings) -> Engine:
    return TrivialEngine()


TRIVIAL = ModelSpec(
    id=MODEL,
    kind=ModelKind.IMAGE,
    request_schema=EditRequest,
    engine_factory=_engine,
    pricing=edit_pricing,
    deadline_seconds=60.0,
)


def register(registry: Registry) -> None:
    registry.register(TRIVIAL)
