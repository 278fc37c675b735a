"""The wire schemas, price and ``ModelSpec`` of local models; no torch here (the api imports it).

Edit models take the contract's edit request, text-to-image models the same without
``images``, image-to-video models the video request; each adds ``seed``,
``num_inference_steps`` and ``guidance_scale``, bounded by the model's entry.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictFloat,
    StrictInt,
    StrictStr,
    field_validator,
)
from pydantic.json_schema import SkipJsonSchema

from genhook.config import Settings
from genhook.engines.base import Charge, Engine, ModelKind, ModelSpec
from genhook.engines.edit_request import EditRequest, mark_no_effect, parse_size
from genhook.engines.local._config import LocalModel, load_local_models
from genhook.engines.video_request import VideoRequest, frame_size, nearest_aspect_ratio

if TYPE_CHECKING:
    from genhook.engines.registry import Registry

MAX_SEED = 2**32 - 1


class _Sampling(BaseModel):
    """The generation knobs every local model takes; unset, the model's entry decides."""

    # The same seed, request and device give the same output (up to rounding when the task
    # shares a batched call: local-models.md); unset, a random one (in info).
    seed: StrictInt | None = Field(default=None, ge=0, le=MAX_SEED)
    num_inference_steps: StrictInt | None = Field(default=None, ge=1, le=500)
    guidance_scale: StrictFloat | None = Field(default=None, ge=0, le=50)


class LocalEditRequest(EditRequest, _Sampling):
    """The edit request of a local edit model."""

    model_config = ConfigDict(json_schema_extra=mark_no_effect)


class LocalTextRequest(EditRequest, _Sampling):
    """A text-to-image request: the edit request without ``images`` (nor in its schema)."""

    model_config = ConfigDict(json_schema_extra=mark_no_effect)

    images: SkipJsonSchema[list[StrictStr]] = Field(default_factory=list)

    @field_validator("images", mode="before")
    @classmethod
    def _no_images(cls, value: Any) -> Any:
        if value:
            raise ValueError("this model makes its picture from the prompt alone: send no images")
        return value


class LocalVideoRequest(VideoRequest, _Sampling):
    """The video request of a local image-to-video model."""


_SCHEMAS: dict[str, type[BaseModel]] = {
    "edit": LocalEditRequest,
    "text": LocalTextRequest,
    "video": LocalVideoRequest,
}


def request_schema(model: LocalModel) -> type[BaseModel]:
    """The family's schema with the entry's bounds, in the schema too (the catalogue, the
    console's form): its most steps, its sizes and a default among them (the contract's
    2048*2048 where offered, else its first)."""
    base: Any = _SCHEMAS[model.family.task]
    sizes = set(model.sizes)
    default_size = "2048*2048" if "2048*2048" in sizes else model.sizes[0]

    class Bounded(base):  # type: ignore[misc]
        num_inference_steps: StrictInt | None = Field(default=None, ge=1, le=model.max_steps)

        if model.family.task != "video":
            size: StrictStr = Field(
                default=default_size, json_schema_extra={"enum": list(model.sizes)}
            )

            @field_validator("size")
            @classmethod
            def _offered(cls, value: str) -> str:
                if value not in sizes:
                    raise ValueError(f"size must be one of: {', '.join(model.sizes)}")
                return value

    Bounded.__name__ = Bounded.__qualname__ = f"{base.__name__}_{_slug(model.id)}"
    schema: type[BaseModel] = Bounded
    return schema


def _slug(model_id: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in model_id)


def output_dimensions(
    request: BaseModel, first_image: tuple[int, int] | None = None
) -> tuple[int, int]:
    """The exact size of the output: the edit contract's ``size``, or the video frame's.

    A video request without ``aspect_ratio`` takes the ratio nearest the first image's
    (``first_image``, its width and height), as ``genhook/image-to-video`` does; before the
    image is known (the price), a 16:9 frame's, which no other ratio of the tier exceeds.
    """
    if isinstance(request, VideoRequest):
        aspect: str = request.aspect_ratio or "16:9"
        if request.aspect_ratio is None and first_image is not None:
            aspect = nearest_aspect_ratio(*first_image)
        return frame_size(request.resolution, aspect)
    assert isinstance(request, EditRequest)
    return parse_size(request.size)


def local_spec(model: LocalModel) -> ModelSpec:
    def engine(settings: Settings) -> Engine:
        from genhook.engines.local._engine import DiffusersEngine

        return DiffusersEngine(model, settings)

    def pricing(settings: Settings, request: BaseModel) -> Charge:
        width, height = output_dimensions(request)
        images = getattr(request, "images", [])
        return Charge(
            tier="per-task",
            output_pixels=width * height,
            input_images=len(images),
            lines=((f"{model.id} task", model.price_usd),),
        )

    def price_list(settings: Settings) -> dict[str, Any]:
        return {
            "summary": f"{model.price_usd} USD per task",
            "unit": "task",
            "prices_usd": {"task": str(model.price_usd)},
        }

    accepted = frozenset({ModelKind.VIDEO}) if model.family.task == "edit" else frozenset()
    what = {"edit": "Edits images", "text": "Makes an image", "video": "Animates an image"}
    description = model.description or (
        f"{what[model.family.task]} with {model.pipeline} from local weights."
    )
    return ModelSpec(
        id=model.id,
        kind=model.kind,
        request_schema=request_schema(model),
        engine_factory=engine,
        pricing=pricing,
        deadline_seconds=model.deadline_seconds,
        accepted_on=accepted,
        description=description,
        price_list=price_list,
        affinity=True,
        max_batch_size=model.max_batch_size,
        max_wait_ms=model.max_wait_ms,
    )


def register_local_models(registry: Registry, settings: Settings) -> None:
    """Register every model of ``GENHOOK_LOCAL_MODELS`` and ``GENHOOK_LOCAL_MODELS_FILE``."""
    for model in load_local_models(settings):
        registry.register(local_spec(model))
    from genhook.engines.local import resident_models

    registry.add_residency(resident_models)
