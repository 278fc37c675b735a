"""Model registry: maps model ids to ``ModelSpec``s.

The shipped registry holds only real engines; operators (and tests) add more through
``GENHOOK_EXTRA_ENGINES=module:function``, each called with the registry.
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable, Iterator, Mapping
from decimal import Decimal
from typing import Any

from pydantic import BaseModel

from genhook.config import Settings
from genhook.engines.audio import STT_SPEC, TTS_SPEC
from genhook.engines.base import Charge, Engine, ModelKind, ModelSpec
from genhook.engines.edit_request import EditRequest
from genhook.engines.image_to_video import video_spec
from genhook.engines.style_names import style_choices

IMAGE_EDIT_MODEL_ID = "genhook/image-edit"
TIER_1_5K_MAX_PIXELS = 2_360_000

PATH_KINDS: dict[str, ModelKind] = {
    "generateImage": ModelKind.IMAGE,
    "generateVideo": ModelKind.VIDEO,
    "generateAudio": ModelKind.AUDIO,
}


class Registry:
    def __init__(self) -> None:
        self._specs: dict[str, ModelSpec] = {}
        self._residency: list[Callable[[], frozenset[str]]] = []
        self._adapters: list[Callable[[], Mapping[str, frozenset[str]]]] = []

    def add_residency(
        self,
        resident: Callable[[], frozenset[str]],
        adapters: Callable[[], Mapping[str, frozenset[str]]] | None = None,
    ) -> None:
        """``resident()`` names the models whose weights this process holds loaded now: an
        engine family with affinity (local models) says so for the worker's claims.
        ``adapters()``, where the family has adapters a request names (LoRAs), gives per
        model the names of those held loaded too."""
        self._residency.append(resident)
        if adapters is not None:
            self._adapters.append(adapters)

    def resident(self) -> frozenset[str]:
        """The models this process holds loaded, as their engines say (affinity)."""
        held: frozenset[str] = frozenset()
        for resident in self._residency:
            held |= resident()
        return held

    def resident_adapters(self) -> dict[str, frozenset[str]]:
        """Per model, the adapters this process holds loaded, as their engines say: among
        a held model's tasks, those naming them are claimed first (affinity)."""
        held: dict[str, frozenset[str]] = {}
        for adapters in self._adapters:
            for model, names in adapters().items():
                held[model] = held.get(model, frozenset()) | names
        return held

    def register(self, spec: ModelSpec) -> None:
        if spec.id in self._specs:
            raise ValueError(f"model {spec.id!r} is already registered")
        self._specs[spec.id] = spec

    def replace(self, spec: ModelSpec) -> None:
        """Put ``spec`` in place of the registered model of its id."""
        if spec.id not in self._specs:
            raise ValueError(f"model {spec.id!r} is not registered")
        self._specs[spec.id] = spec

    def get(self, model_id: str) -> ModelSpec | None:
        return self._specs.get(model_id)

    def __iter__(self) -> Iterator[ModelSpec]:
        return iter(self._specs.values())

    def __len__(self) -> int:
        return len(self._specs)


def submit_paths(spec: ModelSpec) -> list[str]:
    """The submit paths that accept ``spec``, for error messages and docs."""
    return [f"/api/v1/model/{name}" for name, kind in PATH_KINDS.items() if spec.accepts(kind)]


def edit_pricing(settings: Settings, request: BaseModel) -> Charge:
    """Output pixels pick the tier; each input image after the first costs extra."""
    assert isinstance(request, EditRequest)
    width, height = request.dimensions
    pixels = width * height
    inputs = len(request.images)
    if pixels <= TIER_1_5K_MAX_PIXELS:
        tier, price = "1.5K", settings.price_tier_1_5k_usd
    else:
        tier, price = "2K", settings.price_tier_2k_usd
    lines: list[tuple[str, Decimal]] = [(f"output {width}*{height} ({tier} tier)", price)]
    if inputs > 1:
        extra = settings.price_extra_input_image_usd * (inputs - 1)
        lines.append((f"{inputs - 1} additional input image(s)", extra))
    return Charge(tier=tier, output_pixels=pixels, input_images=inputs, lines=tuple(lines))


def edit_price_list(settings: Settings) -> dict[str, Any]:
    """The edit pricing of ``edit_pricing`` for the model catalogue."""
    return {
        "summary": (
            f"{settings.price_tier_1_5k_usd} USD per output up to {TIER_1_5K_MAX_PIXELS} pixels "
            f"(1.5K tier), {settings.price_tier_2k_usd} USD above (2K tier), plus "
            f"{settings.price_extra_input_image_usd} USD per input image after the first"
        ),
        "unit": "task",
        "prices_usd": {
            "1.5K": str(settings.price_tier_1_5k_usd),
            "2K": str(settings.price_tier_2k_usd),
            "extra_input_image": str(settings.price_extra_input_image_usd),
        },
    }


def _image_edit_engine(settings: Settings) -> Engine:
    from genhook.engines.image_edit import ImageEditEngine

    return ImageEditEngine(settings)


IMAGE_EDIT_SPEC = ModelSpec(
    id=IMAGE_EDIT_MODEL_ID,
    kind=ModelKind.IMAGE,
    request_schema=EditRequest,
    engine_factory=_image_edit_engine,
    pricing=edit_pricing,
    deadline_seconds=300.0,
    accepted_on=frozenset({ModelKind.VIDEO}),
    description="Edits 1 to 10 images under a text prompt on the CPU (Pillow, OpenCV, and "
    "neural style transfer on ONNX Runtime).",
    price_list=edit_price_list,
    choices=style_choices,
)


def build_registry(settings: Settings) -> Registry:
    registry = Registry()
    registry.register(IMAGE_EDIT_SPEC)
    registry.register(TTS_SPEC)
    registry.register(STT_SPEC)
    registry.register(video_spec(settings))
    if settings.upstream_models or settings.upstream_models_file:
        from genhook.engines.upstream import register_upstream_models

        register_upstream_models(registry, settings)
    if settings.local_models or settings.local_models_file:
        from genhook.engines.local import register_local_models

        register_local_models(registry, settings)
    if settings.models or settings.models_file:
        from genhook.engines.predictor import register_predictor_models

        register_predictor_models(registry, settings)
    for target in settings.extra_engines:
        module_name, _, func_name = target.partition(":")
        module = importlib.import_module(module_name)
        getattr(module, func_name or "register")(registry)
    apply_batching(registry, settings)
    for model_id in settings.preload_models:
        if registry.get(model_id) is None:
            raise ValueError(
                f"GENHOOK_PRELOAD_MODELS (--preload): unknown model {model_id!r} "
                f"(known: {_known(registry)})"
            )
    for model_id in settings.worker_models:
        if registry.get(model_id) is None:
            raise ValueError(
                f"GENHOOK_WORKER_MODELS (--model): unknown model {model_id!r} "
                f"(known: {_known(registry)})"
            )
    return registry


def claimable_models(registry: Registry, settings: Settings) -> list[str]:
    """The models a worker claims tasks of: ``GENHOOK_WORKER_MODELS`` when set (a worker
    pool per model group, e.g. the GPU pool of the local models), else every one."""
    chosen = settings.worker_models
    return [spec.id for spec in registry if not chosen or spec.id in chosen]


def _known(registry: Registry) -> str:
    return ", ".join(sorted(spec.id for spec in registry))


def apply_batching(registry: Registry, settings: Settings) -> None:
    """Set the models' batch sizes, waits and concurrency from ``GENHOOK_MODEL_BATCHING``;
    a model id that names no registered model fails the start, not silently."""
    for model_id, tuning in settings.model_batching.items():
        spec = registry.get(model_id)
        if spec is None:
            raise ValueError(
                f"GENHOOK_MODEL_BATCHING: unknown model {model_id!r} (known: {_known(registry)})"
            )
        registry.replace(dataclasses.replace(spec, **tuning.model_dump(exclude_none=True)))
