"""The upstream engine: genhook's contract in front of a model server the operator runs.

It is an ``AsyncEngine``: a job is mostly waiting on the network, so one worker process
runs up to the model's ``concurrency`` of them at once on its event loop, and the task's
deadline cancels the call in flight.
"""

from __future__ import annotations

import asyncio
import io
import os
import threading
from decimal import Decimal
from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict, Field, StrictStr

from genhook.config import Settings
from genhook.engines.base import (
    Charge,
    EngineJob,
    EngineOutput,
    EngineResult,
    ModelKind,
    ModelSpec,
)
from genhook.engines.edit_request import MAX_IMAGES, EditRequest, mark_no_effect
from genhook.engines.upstream._adapters import Adapter, OpenAIImages, Produced, QueueAdapter
from genhook.engines.upstream._callbacks import CallbackBox
from genhook.engines.upstream._config import UpstreamModel, load_upstream_models
from genhook.engines.upstream._http import UpstreamHttp, bad_response
from genhook.errors import ErrorCode, TaskFailure
from genhook.media import CONTENT_TYPES, sniff_image_format
from genhook.net import AddressPolicy, client_ssl_context, fetch_input_image

if TYPE_CHECKING:
    from genhook.engines.media.nsfw import Detector
    from genhook.engines.registry import Registry

_KIND_CONTENT_TYPES = {ModelKind.VIDEO: "video/mp4", ModelKind.AUDIO: "audio/mpeg"}


class UpstreamEditRequest(EditRequest):
    """The edit request as an upstream model takes it: the built-in engine's modes do nothing."""

    model_config = ConfigDict(json_schema_extra=mark_no_effect)


class OptionalImagesRequest(UpstreamEditRequest):
    """The edit request with ``images`` optional, for text-to-X upstreams."""

    images: list[StrictStr] = Field(default_factory=list, max_length=MAX_IMAGES)


class UpstreamEngine:
    def __init__(self, model: UpstreamModel, settings: Settings) -> None:
        self.model = model
        self.settings = settings
        self._http: UpstreamHttp | None = None
        self._callbacks: CallbackBox | None = None
        self._adapter: Adapter | None = None
        self._limit: asyncio.Semaphore | None = None
        self._detector: Detector | None = None
        self._detector_lock = threading.Lock()
        self._policy = AddressPolicy(allow_private=settings.webhook_allow_private_targets)
        self._ssl_context = client_ssl_context(settings.webhook_ca_file)

    def load(self) -> None:
        credential = None
        if self.model.credential_env:
            credential = os.environ.get(self.model.credential_env)
            if not credential:
                raise RuntimeError(
                    f"upstream model {self.model.id!r}: the environment variable "
                    f"{self.model.credential_env} is not set"
                )
        self._http = UpstreamHttp(self.model, credential)
        if self.model.adapter == "openai-images":
            self._adapter = OpenAIImages(self.model, self._http)
        else:
            assert self.model.queue is not None
            if self.model.queue.callback:
                self._callbacks = CallbackBox(self.settings)
            self._adapter = QueueAdapter(self.model, self._http, self._callbacks)

    def run(self, job: EngineJob) -> EngineResult:
        """For callers outside a worker's loop (scripts); the worker uses ``run_async``."""

        async def once() -> EngineResult:
            try:
                return await self.run_async(job)
            finally:
                await self.aclose()

        return asyncio.run(once())

    async def aclose(self) -> None:
        if self._http is not None:
            await self._http.aclose()
        if self._callbacks is not None:
            await self._callbacks.aclose()

    async def run_async(self, job: EngineJob) -> EngineResult:
        if self._adapter is None:
            self.load()
        assert self._adapter is not None
        if self._limit is None:
            self._limit = asyncio.Semaphore(self.model.concurrency)
        async with self._limit:
            produced = await self._adapter.produce(job)
        outputs = await self._outputs(produced)
        return EngineResult(outputs=outputs, info=produced.info, cost_usd=produced.cost_usd)

    async def _outputs(self, produced: Produced) -> list[EngineOutput]:
        blobs: list[tuple[bytes, str]] = []
        for index, item in enumerate(produced.items):
            data = item if isinstance(item, bytes) else await self._fetch(item, index)
            if len(data) > self.model.max_output_bytes:
                raise TaskFailure(
                    ErrorCode.UPSTREAM_OUTPUT_FETCH_FAILED,
                    f"output {index} from the upstream is larger than the "
                    f"{self.model.max_output_bytes}-byte limit",
                )
            if self.model.kind is not ModelKind.IMAGE:
                blobs.append((data, _KIND_CONTENT_TYPES[self.model.kind]))
                continue
            fmt = sniff_image_format(data)
            if fmt is None:
                raise bad_response(f"output {index} from the upstream is not an image")
            blobs.append((data, CONTENT_TYPES[fmt]))
        flags = produced.nsfw
        if flags is None:
            flags = [await self._detect(data, kind) for data, kind in blobs]
        return [
            EngineOutput(data=data, content_type=kind, nsfw=flag)
            for (data, kind), flag in zip(blobs, flags, strict=True)
        ]

    async def _fetch(self, url: str, index: int) -> bytes:
        """An output URL, under the address policy and the byte cap, like an input image."""
        try:
            return await fetch_input_image(
                url,
                policy=self._policy,
                max_bytes=self.model.max_output_bytes,
                timeout=self.model.timeout_seconds,
                ssl_context=self._ssl_context,
            )
        except TaskFailure as failure:
            if failure.code is ErrorCode.INPUT_ADDRESS_REFUSED:
                raise TaskFailure(
                    ErrorCode.UPSTREAM_OUTPUT_REFUSED,
                    f"output {index} from the upstream is a URL pointing at an address the "
                    "service does not connect to",
                ) from None
            why = failure.message.split(": ", 1)[-1]
            if failure.code is ErrorCode.INPUT_TOO_LARGE:
                why = f"larger than the {self.model.max_output_bytes}-byte limit"
            raise TaskFailure(
                ErrorCode.UPSTREAM_OUTPUT_FETCH_FAILED,
                f"output {index} from the upstream could not be fetched: {why}",
            ) from None

    async def _detect(self, data: bytes, content_type: str) -> bool:
        if not self.model.detect_nsfw or not content_type.startswith("image/"):
            return False
        return await asyncio.to_thread(self._detect_sync, data)

    def _detect_sync(self, data: bytes) -> bool:
        from PIL import Image

        from genhook.engines.media.nsfw import Detector

        with self._detector_lock:
            if self._detector is None:
                self._detector = Detector(threads=1)
            try:
                with Image.open(io.BytesIO(data)) as image:
                    score = self._detector.detect(image, 320).nsfw_score
            except (OSError, ValueError):
                raise bad_response("an output from the upstream cannot be decoded") from None
        return score >= self.settings.nsfw_threshold


def upstream_spec(model: UpstreamModel) -> ModelSpec:
    def engine(settings: Settings) -> UpstreamEngine:
        return UpstreamEngine(model, settings)

    def pricing(settings: Settings, request: BaseModel) -> Charge:
        assert isinstance(request, EditRequest)
        width, height = request.dimensions
        lines: tuple[tuple[str, Decimal], ...] = ((f"{model.id} task", model.price_usd),)
        return Charge(
            tier="per-task",
            output_pixels=width * height,
            input_images=len(request.images),
            lines=lines,
        )

    schema: type[EditRequest] = (
        UpstreamEditRequest if model.images_required else OptionalImagesRequest
    )
    description = model.description or f"Served by an upstream model server ({model.adapter})."
    return ModelSpec(
        id=model.id,
        kind=model.kind,
        request_schema=schema,
        engine_factory=engine,
        pricing=pricing,
        deadline_seconds=model.deadline_seconds,
        description=description,
        concurrency=model.concurrency,
    )


def register_upstream_models(registry: Registry, settings: Settings) -> None:
    """Register every model of ``GENHOOK_UPSTREAM_MODELS`` and ``GENHOOK_UPSTREAM_MODELS_FILE``."""
    for model in load_upstream_models(settings):
        registry.register(upstream_spec(model))
