"""Models served by a predictor class: a ``genhook.model.Model`` or a Cog predictor.

See ``docs/engines/your-model.md``. The entries come from ``GENHOOK_MODELS`` and
``GENHOOK_MODELS_FILE``; each names its class by file path or module, or a Cog project
directory. The request schema is derived from ``predict``'s signature (``_signature.py``);
the engine (``_engine.py``) runs the class in the worker.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

from genhook.config import Settings
from genhook.engines.base import Charge, Engine, ModelSpec
from genhook.engines.predictor._config import (
    PredictorEntry,
    PredictorModel,
    check_entry,
    load_class,
    load_predictor_models,
)
from genhook.engines.predictor._signature import request_schema

if TYPE_CHECKING:
    from genhook.engines.registry import Registry


def predictor_spec(model: PredictorModel) -> ModelSpec:
    """The ``ModelSpec`` of a checked entry: its schema from ``predict``, a flat price per
    task, its deadline, batching and concurrency."""

    def engine(settings: Settings) -> Engine:
        from genhook.engines.predictor._engine import PredictorEngine

        return PredictorEngine(model, settings)

    def pricing(settings: Settings, request: BaseModel) -> Charge:
        return Charge(
            tier="per-task",
            output_pixels=0,
            input_images=0,
            lines=((f"{model.id} task", model.price_usd),),
        )

    def price_list(settings: Settings) -> dict[str, Any]:
        return {
            "summary": f"{model.price_usd} USD per task",
            "unit": "task",
            "prices_usd": {"task": str(model.price_usd)},
        }

    entry = model.entry
    return ModelSpec(
        id=model.id,
        kind=entry.kind,
        request_schema=request_schema(model.id, model.params, model.description),
        engine_factory=engine,
        pricing=pricing,
        deadline_seconds=model.deadline_seconds,
        description=model.description,
        price_list=price_list,
        concurrency=entry.concurrency,
        max_batch_size=entry.max_batch_size,
        max_wait_ms=entry.max_wait_ms,
    )


def register_predictor_models(registry: Registry, settings: Settings) -> None:
    """Register every model of ``GENHOOK_MODELS`` and ``GENHOOK_MODELS_FILE``."""
    for model in load_predictor_models(settings):
        registry.register(predictor_spec(model))


__all__ = [
    "PredictorEntry",
    "PredictorModel",
    "check_entry",
    "load_class",
    "load_predictor_models",
    "predictor_spec",
    "register_predictor_models",
]
