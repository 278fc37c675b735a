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
    model_validator,
)
from pydantic.json_schema import SkipJsonSchema

from genhook.config import Settings
from genhook.engines.base import Charge, Engine, ModelKind, ModelSpec
from genhook.engines.edit_request import EditRequest, mark_no_effect, parse_size
from genhook.engines.local._config import (
    MAX_LORA_SCALE,
    MAX_LORAS,
    LocalModel,
    load_local_models,
)
from genhook.engines.video_request import VideoRequest, frame_size, nearest_aspect_ratio

if TYPE_CHECKING:
    from genhook.engines.registry import Registry

MAX_SEED = 2**32 - 1
# A LoRA file's URL may be a signed object-store URL, as an input image's.
MAX_LORA_URL_LENGTH = 8192


class LoraChoice(BaseModel):
    """One LoRA adapter of a request: an adapter of the model's entry by ``name``, or (where
    the operator allows it) a ``.safetensors`` file by ``url``; its ``scale`` (unset: the
    entry's, or 1 for a URL)."""

    model_config = ConfigDict(extra="forbid", strict=True)

    name: StrictStr | None = Field(default=None, max_length=64)
    url: StrictStr | None = Field(default=None, min_length=1, max_length=MAX_LORA_URL_LENGTH)
    scale: StrictFloat | None = Field(default=None, ge=-MAX_LORA_SCALE, le=MAX_LORA_SCALE)

    @model_validator(mode="after")
    def _one_source(self) -> LoraChoice:
        if (self.name is None) == (self.url is None):
            raise ValueError("give the adapter's name or its url (exactly one of them)")
        return self


class _Sampling(BaseModel):
    """The generation knobs every local model takes; unset, the model's entry decides."""

    # The same seed, request and device give the same output (up to rounding when the task
    # shares a batched call: local-models.md); unset, a random one (in info).
    seed: StrictInt | None = Field(default=None, ge=0, le=MAX_SEED)
    num_inference_steps: StrictInt | None = Field(default=None, ge=1, le=500)
    guidance_scale: StrictFloat | None = Field(default=None, ge=0, le=50)
    # LoRA adapters applied to this request's call (docs/engines/local-models.md).
    loras: list[LoraChoice] = Field(default_factory=list, max_length=MAX_LORAS)


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


def request_schema(model: LocalModel, lora_urls: bool = False) -> type[BaseModel]:
    """The family's schema with the entry's bounds, in the schema too (the catalogue, the
    console's form): its most steps, its sizes and a default among them (the contract's
    2048*2048 where offered, else its first), its LoRA adapters' names (and URLs only where
    ``lora_urls``)."""
    base: Any = _SCHEMAS[model.family.task]
    sizes = set(model.sizes)
    default_size = "2048*2048" if "2048*2048" in sizes else model.sizes[0]
    names = list(model.loras)
    offered: dict[str, Any] = {"enum": names}

    class Choice(LoraChoice):
        name: StrictStr | None = Field(default=None, max_length=64, json_schema_extra=offered)
        if not lora_urls:
            url: SkipJsonSchema[StrictStr | None] = None

    Choice.__name__ = Choice.__qualname__ = f"LoraChoice_{_slug(model.id)}"

    class Bounded(base):  # type: ignore[misc]
        num_inference_steps: StrictInt | None = Field(default=None, ge=1, le=model.max_steps)
        # Listed where the model offers adapters; elsewhere a request's are refused by name.
        if names or lora_urls:
            loras: list[Choice] = Field(default_factory=list, max_length=MAX_LORAS)
        else:
            loras: SkipJsonSchema[list[Choice]] = Field(  # type: ignore[no-redef]
                default_factory=list, max_length=MAX_LORAS
            )

        @field_validator("loras")
        @classmethod
        def _known(cls, value: list[LoraChoice]) -> list[LoraChoice]:
            return check_loras(model, value, lora_urls)

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


def check_loras(model: LocalModel, loras: list[LoraChoice], lora_urls: bool) -> list[LoraChoice]:
    """A request's adapters against the entry: each name one it offers, no adapter twice,
    a URL only where the operator allows them (``ValueError`` naming what is wrong)."""
    seen: set[str] = set()
    for choice in loras:
        if choice.name is not None:
            if choice.name not in model.loras:
                offered = ", ".join(model.loras) or "none"
                raise ValueError(
                    f"unknown LoRA adapter {choice.name!r} (this model offers: {offered})"
                )
            key = choice.name
        else:
            if not lora_urls:
                raise ValueError(
                    "LoRA adapters by URL are not enabled on this service "
                    "(GENHOOK_LOCAL_MODELS_LORA_URLS)"
                )
            key = f"url {choice.url}"
        if key in seen:
            raise ValueError(f"LoRA adapter {choice.name or choice.url!r} is given twice")
        seen.add(key)
    return loras


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


def request_loras(request: Any) -> list[LoraChoice]:
    """A request's adapters; a request rebuilt from a task's stored params (validated at
    submit) holds them as plain objects."""
    return [
        c if isinstance(c, LoraChoice) else LoraChoice.model_construct(**c)
        for c in getattr(request, "loras", None) or ()
    ]


def lora_lines(model: LocalModel, request: BaseModel) -> list[tuple[str, Any]]:
    """The usage lines of a request's adapters: one per adapter the entry prices."""
    lines: list[tuple[str, Any]] = []
    for choice in request_loras(request):
        if choice.name is not None:
            price = model.loras[choice.name].price_usd
            label = f"{model.id} LoRA {choice.name}"
        else:
            price, label = model.lora_url_price_usd, f"{model.id} LoRA by URL"
        if price:
            lines.append((label, price))
    return lines


def lora_choices(model: LocalModel) -> dict[str, Any]:
    """The catalogue's ``choices.loras``: each adapter's description, default scale and price."""
    return {
        "loras": [
            {
                "name": name,
                "description": lora.description,
                "scale": lora.scale,
                "price_usd": str(lora.price_usd),
            }
            for name, lora in model.loras.items()
        ]
    }


def local_spec(model: LocalModel, lora_urls: bool = False) -> ModelSpec:
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
            lines=((f"{model.id} task", model.price_usd), *lora_lines(model, request)),
        )

    def price_list(settings: Settings) -> dict[str, Any]:
        prices = {"task": str(model.price_usd)}
        extra = ""
        for name, lora in model.loras.items():
            if lora.price_usd:
                prices[f"lora:{name}"] = str(lora.price_usd)
                extra = ", plus the price of each LoRA adapter used"
        if lora_urls and model.lora_url_price_usd:
            prices["lora:url"] = str(model.lora_url_price_usd)
            extra = ", plus the price of each LoRA adapter used"
        return {
            "summary": f"{model.price_usd} USD per task{extra}",
            "unit": "task",
            "prices_usd": prices,
        }

    accepted = frozenset({ModelKind.VIDEO}) if model.family.task == "edit" else frozenset()
    what = {"edit": "Edits images", "text": "Makes an image", "video": "Animates an image"}
    description = model.description or (
        f"{what[model.family.task]} with {model.pipeline} from local weights."
    )
    return ModelSpec(
        id=model.id,
        kind=model.kind,
        request_schema=request_schema(model, lora_urls),
        engine_factory=engine,
        pricing=pricing,
        deadline_seconds=model.deadline_seconds,
        accepted_on=accepted,
        description=description,
        price_list=price_list,
        affinity=True,
        max_batch_size=model.max_batch_size,
        max_wait_ms=model.max_wait_ms,
        choices=(lambda: lora_choices(model)) if model.loras else None,
    )


def register_local_models(registry: Registry, settings: Settings) -> None:
    """Register every model of ``GENHOOK_LOCAL_MODELS`` and ``GENHOOK_LOCAL_MODELS_FILE``."""
    for model in load_local_models(settings):
        registry.register(local_spec(model, settings.local_models_lora_urls))
    from genhook.engines.local import resident_adapters, resident_models

    registry.add_residency(resident_models, adapters=resident_adapters)
