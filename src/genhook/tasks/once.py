"""One model call in this process, without the service: ``genhook predict``.

The request goes through what a submit does (``validate_request``, the input files and the
pixel budget, ``stored_params``) and the inputs through what a worker does (data URLs
decoded, URLs fetched under the address policy), then the model's engine is loaded and run
once, exactly as a worker runs it. Nothing is written to a database.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel

from genhook.config import Settings
from genhook.engines.base import AsyncEngine, EngineJob, EngineResult, ModelKind
from genhook.engines.edit_request import ImageRef
from genhook.engines.registry import Registry
from genhook.errors import TaskFailure
from genhook.net import AddressPolicy, client_ssl_context
from genhook.tasks.submission import input_refs, stored_params, validate_request


@dataclass(frozen=True, slots=True)
class Prediction:
    request: BaseModel
    result: EngineResult
    seconds: float  # the engine call alone, without its load


async def predict_once(
    settings: Settings,
    registry: Registry,
    body: dict[str, Any],
    report: Callable[..., None],
    policy: AddressPolicy | None = None,
) -> Prediction:
    """Run ``body`` (a submit body, ``model`` included) through its model once.

    Raises ``InvalidRequest`` for a body a submit would refuse (400) and ``TaskFailure`` for
    what would fail the task."""
    spec = registry.get(str(body.get("model")))
    context: dict[str, Any] = {}
    path_kind = spec.kind if spec is not None else ModelKind.IMAGE
    request = validate_request(registry, path_kind, body, context)
    assert spec is not None  # validate_request refused an unknown model
    refs = input_refs(request, context, settings.max_task_input_pixels)
    policy = policy or AddressPolicy(allow_private=settings.webhook_allow_private_targets)
    images = [await _input_bytes(ref, index, settings, policy) for index, ref in enumerate(refs)]
    engine = spec.engine_factory(settings)
    await asyncio.to_thread(engine.load)
    deadline = settings.task_deadline_seconds or spec.deadline_seconds
    job = EngineJob(
        task_id=f"predict-{secrets.token_hex(8)}",
        model=spec.id,
        params=stored_params(request),
        images=images,
        report=report,
        deadline=time.time() + deadline,
        request=request,
    )
    started = time.monotonic()
    if isinstance(engine, AsyncEngine):
        result = await asyncio.wait_for(engine.run_async(job), deadline)
    else:
        result = await asyncio.to_thread(engine.run, job)
    return Prediction(request, result, time.monotonic() - started)


async def _input_bytes(
    ref: ImageRef, index: int, settings: Settings, policy: AddressPolicy
) -> bytes:
    """A data URL's bytes, or the URL's fetched as a worker fetches them."""
    if ref.data is not None:
        return bytes(ref.data)
    from genhook.net import fetch_input_image

    assert ref.url is not None
    try:
        return await fetch_input_image(
            ref.url,
            policy=policy,
            max_bytes=settings.input_max_bytes,
            timeout=settings.input_fetch_timeout_seconds,
            ssl_context=client_ssl_context(settings.webhook_ca_file),
        )
    except TaskFailure as failure:
        label = ref.field or f"images[{index}]"
        raise TaskFailure(failure.code, f"{label}: {failure.message}") from None
